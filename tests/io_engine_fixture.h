// The I/O engine tests' shared parts (tests/io_engine_test.cpp, tests/io_engine_faults_test.cpp):
// a file of known bytes, the pread oracle, an EIO hook, the backend configurations, and the
// fixture that writes the file and builds the engine's options for its configuration.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/io_engine.h"
#include "tests/support/strict_skip.h"

namespace moestream::io_test {

namespace fs = std::filesystem;

constexpr uint64_t kFileBytes = (4 << 20) + 1234;  // not a multiple of 4 KiB: tail handling

inline std::string make_content(uint64_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<uint64_t>(8, n - i));
  }
  return s;
}

// The oracle: plain pread of the same range.
inline std::string oracle(const fs::path& p, uint64_t off, uint64_t len) {
  int fd = ::open(p.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  std::string s(len, '\0');
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, s.data() + done, len - done, static_cast<off_t>(off + done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  s.resize(done);
  ::close(fd);
  return s;
}

// A completion hook failing every read at file offset `offset` with EIO.
inline CompletionHook eio_at(uint64_t offset) {
  return [offset](const CompletionInfo& c) -> int64_t { return c.offset == offset ? -EIO : c.result; };
}

struct Config {
  IoBackend backend;
  bool direct;
  bool batch_submit = false;  // io_uring: each ring submits its share of a batch at once
};

inline void PrintTo(const Config& c, std::ostream* os) {
  *os << io_backend_name(c.backend) << (c.direct ? " O_DIRECT" : " buffered")
      << (c.batch_submit ? " batch submit" : "");
}

inline std::string config_name(const testing::TestParamInfo<Config>& info) {
  return std::string(io_backend_name(info.param.backend)) + (info.param.direct ? "Direct" : "Buffered") +
         (info.param.batch_submit ? "BatchSubmit" : "");
}

// The backends with a completion path (io_uring, also submitting a batch at once, and pread),
// buffered and O_DIRECT: where faults are injected.
inline std::vector<Config> completion_configs() {
  return {{IoBackend::kUring, false}, {IoBackend::kUring, true},  {IoBackend::kUring, false, true},
          {IoBackend::kUring, true, true}, {IoBackend::kPread, false}, {IoBackend::kPread, true}};
}

// Those and mmap.
inline std::vector<Config> every_config() {
  std::vector<Config> v = completion_configs();
  v.push_back({IoBackend::kMmap, false});
  return v;
}

class IoEngineTest : public testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    if (GetParam().backend == IoBackend::kUring) {
      int err = 0;
      if (!io_uring_available(&err))
        MOESTREAM_SKIP_OR_FAIL() << "io_uring_queue_init fails here: " << std::strerror(err);
    }
    path_ = dir_.path() / "data.bin";
    content_ = make_content(kFileBytes, 7);
    write_file_atomic(path_, content_);
  }

  IoEngineOptions options() const {
    IoEngineOptions o;
    o.backend = GetParam().backend;
    o.direct = GetParam().direct;
    o.n_rings = 3;
    o.n_threads = 3;
    o.queue_depth = 8;
    o.uring_batch_submit = GetParam().batch_submit;
    o.direct_max_read_bytes = 0;  // max_read_bytes for every file, as the tests set it
    o.notice = [this](const std::string& s) { notices_.push_back(s); };
    return o;
  }

  // Reads the file's first n 16 KiB pieces as n adjacent requests through an engine with
  // options o, checks their bytes; returns the reads the engine issued.
  uint64_t read_adjacent_pieces(const IoEngineOptions& o, int n) {
    IoEngine eng(o);
    uint32_t f = eng.add_file(path_);
    std::string buf(size_t(n) << 14, 0);
    std::vector<ReadRequest> reqs;
    for (int i = 0; i < n; ++i) reqs.push_back({f, uint64_t(i) << 14, 1 << 14, buf.data() + (i << 14)});
    eng.read(reqs);
    EXPECT_EQ(buf, content_.substr(0, buf.size()));
    return eng.stats().reads_issued;
  }

  TempDir dir_{"io_engine_test"};
  fs::path path_;
  std::string content_;
  mutable std::vector<std::string> notices_;
};

}  // namespace moestream::io_test
