// Tests of loader/io/io_engine.h: coalescing, splitting and placement against a pread oracle on
// every backend, truncation, unknown files, backend names. Injected completion outcomes and the
// fallbacks: tests/io_engine_faults_test.cpp.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/io_engine.h"
#include "tests/io_engine_fixture.h"
#include "tests/support/test_model.h"

using namespace moestream;
using namespace moestream::io_test;

namespace {

TEST_P(IoEngineTest, RandomBatchesMatchPreadOracle) {
  IoEngineOptions o = options();
  o.coalesce_gap_bytes = 8192;
  o.max_read_bytes = 256 << 10;
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  EXPECT_EQ(eng.file_is_direct(f), GetParam().direct);
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    int n = 1 + static_cast<int>(rng() % 64);
    std::vector<ReadRequest> reqs(n);
    std::vector<std::string> bufs(n);
    uint64_t cursor = rng() % kFileBytes;
    for (int i = 0; i < n; ++i) {
      // A mix of adjacent, nearly adjacent, overlapping and far-apart requests.
      uint64_t len = 1 + rng() % (rng() % 2 ? 4096 : 70000);
      uint64_t off;
      switch (rng() % 4) {
        case 0: off = cursor; break;
        case 1: off = cursor + rng() % 10000; break;
        case 2: off = cursor > 3000 ? cursor - rng() % 3000 : 0; break;
        default: off = rng() % kFileBytes; break;
      }
      off = std::min(off, kFileBytes - 1);
      len = std::min(len, kFileBytes - off);
      cursor = off + len;
      bufs[i].assign(len + 1, '\xAB');  // +1: catch overruns past length
      reqs[i] = {f, off, len, bufs[i].data()};
    }
    std::shuffle(reqs.begin(), reqs.end(), rng);
    ASSERT_NO_THROW(eng.read(reqs)) << "round " << round;
    for (const ReadRequest& r : reqs) {
      ASSERT_EQ(r.result, ReadResult::kOk);
      std::string got(static_cast<const char*>(r.dest), r.length);
      ASSERT_EQ(got, oracle(path_, r.offset, r.length)) << "offset " << r.offset;
      ASSERT_EQ(static_cast<const char*>(r.dest)[r.length], '\xAB') << "wrote past the request";
    }
  }
  IoEngineStats s = eng.stats();
  EXPECT_LT(s.reads_issued, s.requests);  // some requests were coalesced
  EXPECT_EQ(s.failed_requests, 0u);
  if (!GetParam().direct && GetParam().backend != IoBackend::kMmap) {
    EXPECT_GT(s.scatter_reads, 0u);  // both placement paths were exercised
    EXPECT_GT(s.bounce_bytes, 0u);   // (overlapping requests always bounce)
  }
}

TEST_P(IoEngineTest, AdjacentRequestsWithContiguousDestsAreOneInPlaceRead) {
  IoEngine eng(options());
  uint32_t f = eng.add_file(path_);
  // 4 KiB aligned slots and an aligned buffer, so O_DIRECT can read in place too.
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, 4096, 16 * 4096), 0);
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  std::vector<ReadRequest> reqs;
  for (int i = 3; i >= 0; --i)  // out of order on purpose: the engine sorts
    reqs.push_back({f, 8192 + uint64_t(i) * 16384, 16384, static_cast<char*>(raw) + i * 16384});
  eng.read(reqs);
  EXPECT_EQ(std::string(static_cast<char*>(raw), 65536), content_.substr(8192, 65536));
  IoEngineStats s = eng.stats();
  EXPECT_EQ(s.requests, 4u);
  EXPECT_EQ(s.reads_issued, 1u);
  if (GetParam().backend != IoBackend::kMmap) {
    EXPECT_EQ(s.bounce_bytes, 0u);
  }
}

TEST_P(IoEngineTest, SeparateDestsAreScatteredWithoutABounceCopy) {
  for (bool scatter : {true, false}) {
    IoEngineOptions o = options();
    o.scatter = scatter;
    IoEngine eng(o);
    uint32_t f = eng.add_file(path_);
    // Expert-like slots: 4 KiB aligned, one 8 KiB hole, three separate aligned buffers.
    std::vector<void*> raw(3);
    for (auto& p : raw) ASSERT_EQ(::posix_memalign(&p, 4096, 3 * 4096), 0);
    std::vector<ReadRequest> reqs{{f, 5 * 4096, 3 * 4096, raw[2]},
                                  {f, 8 * 4096, 2 * 4096, raw[0]},
                                  {f, 12 * 4096, 3 * 4096, raw[1]}};
    eng.read(reqs);
    for (const ReadRequest& r : reqs)
      EXPECT_EQ(std::string(static_cast<char*>(r.dest), r.length), content_.substr(r.offset, r.length));
    IoEngineStats s = eng.stats();
    EXPECT_EQ(s.reads_issued, 1u);
    if (GetParam().backend != IoBackend::kMmap) {
      EXPECT_EQ(s.scatter_reads, scatter ? 1u : 0u);
      EXPECT_EQ(s.bounce_bytes, scatter ? 0u : 10u * 4096);
    }
    for (auto& p : raw) std::free(p);
  }
}

TEST_P(IoEngineTest, GapThresholdDecidesCoalescing) {
  for (uint64_t gap : {uint64_t{4096}, uint64_t{16384}}) {
    IoEngineOptions o = options();
    o.coalesce_gap_bytes = gap;
    IoEngine eng(o);
    uint32_t f = eng.add_file(path_);
    std::string a(20000, 0), b(20000, 0);
    // 12 KiB hole between the two requests: read through only when the threshold allows it.
    std::vector<ReadRequest> reqs{{f, 40960, 20000, a.data()}, {f, 40960 + 20000 + 12288, 20000, b.data()}};
    eng.read(reqs);
    EXPECT_EQ(a, content_.substr(40960, 20000));
    EXPECT_EQ(b, content_.substr(40960 + 20000 + 12288, 20000));
    EXPECT_EQ(eng.stats().reads_issued, gap >= 12288 ? 1u : 2u) << "gap " << gap;
  }
}

TEST_P(IoEngineTest, MaxReadBytesBoundsACoalescedRead) {
  IoEngineOptions o = options();
  o.max_read_bytes = 64 << 10;
  EXPECT_EQ(read_adjacent_pieces(o, 16), 4u);
}

TEST_P(IoEngineTest, LargeRequestIsSplitIntoParallelReads) {
  IoEngineOptions o = options();
  o.max_read_bytes = 64 << 10;
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  // One aligned and one unaligned large request, plus a small one.
  std::string a(300000, 0), b(200001, 0), c(100, 0);
  std::vector<ReadRequest> reqs{{f, 1 << 20, 300000, a.data()},
                                {f, (2 << 20) + 333, 200001, b.data()},
                                {f, 50, 100, c.data()}};
  eng.read(reqs);
  EXPECT_EQ(a, content_.substr(1 << 20, 300000));
  EXPECT_EQ(b, content_.substr((2 << 20) + 333, 200001));
  EXPECT_EQ(c, content_.substr(50, 100));
  EXPECT_GE(eng.stats().reads_issued, 5u + 4u + 1u);
}

TEST_P(IoEngineTest, DirectFilesUseTheirOwnReadSizeCap) {
  IoEngineOptions o = options();
  o.max_read_bytes = 64 << 10;
  o.direct_max_read_bytes = 1 << 20;
  IoEngine eng(o);
  eng.add_file(path_);
  std::string buf(600 << 10, '\0');
  std::vector<ReadRequest> reqs{{0, 8192, buf.size(), buf.data()}};
  eng.read(reqs);
  EXPECT_EQ(buf, content_.substr(8192, buf.size()));
  // O_DIRECT: one read of the whole request; buffered (and mmap): 64 KiB pieces.
  const bool direct = eng.file_is_direct(0);
  EXPECT_EQ(eng.stats().reads_issued, direct ? 1u : 10u);
}

TEST_P(IoEngineTest, CoalescingOffIssuesOneReadPerRequest) {
  IoEngineOptions o = options();
  o.coalesce = false;
  EXPECT_EQ(read_adjacent_pieces(o, 4), 4u);
}

TEST_P(IoEngineTest, SeveralFilesInOneBatch) {
  fs::path p2 = dir_.path() / "other.bin";
  std::string c2 = make_content(100000, 99);
  write_file_atomic(p2, c2);
  IoEngine eng(options());
  uint32_t f1 = eng.add_file(path_);
  uint32_t f2 = eng.add_file(p2);
  std::string a(5000, 0), b(5000, 0), c(5000, 0);
  std::vector<ReadRequest> reqs{{f2, 100, 5000, a.data()}, {f1, 100, 5000, b.data()}, {f2, 5100, 5000, c.data()}};
  eng.read(reqs);
  EXPECT_EQ(a, c2.substr(100, 5000));
  EXPECT_EQ(b, content_.substr(100, 5000));
  EXPECT_EQ(c, c2.substr(5100, 5000));
}

TEST_P(IoEngineTest, ReadPastEndOfFileIsTruncatedAndNamesTheFile) {
  IoEngine eng(options());
  uint32_t f = eng.add_file(path_);
  std::string ok(1000, 0), bad(10000, 0);
  std::vector<ReadRequest> reqs{{f, 0, 1000, ok.data()}, {f, kFileBytes - 100, 10000, bad.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kOk);
  EXPECT_EQ(ok, content_.substr(0, 1000));
  EXPECT_EQ(reqs[1].result, ReadResult::kTruncated);
  const std::string msg = test::error_message<IoError>([&] { eng.read(reqs); });
  EXPECT_NE(msg.find(path_.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kFileBytes - 100)), std::string::npos) << msg;
}

TEST_P(IoEngineTest, FileTruncatedAfterOpenIsReported) {
  IoEngine eng(options());
  uint32_t f = eng.add_file(path_);
  ASSERT_EQ(::truncate(path_.c_str(), 1 << 20), 0);
  std::string buf(8192, 0);
  std::vector<ReadRequest> reqs{{f, 2 << 20, 8192, buf.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kTruncated);
}

TEST_P(IoEngineTest, ZeroLengthRequestsSucceedWithoutIo) {
  IoEngine eng(options());
  uint32_t f = eng.add_file(path_);
  std::vector<ReadRequest> reqs{{f, 123, 0, nullptr}};
  eng.read(reqs);
  EXPECT_EQ(reqs[0].result, ReadResult::kOk);
  EXPECT_EQ(eng.stats().reads_issued, 0u);
}

TEST_P(IoEngineTest, UnknownFileIndexIsAConfigError) {
  IoEngine eng(options());
  std::string buf(10, 0);
  std::vector<ReadRequest> reqs{{5, 0, 10, buf.data()}};
  EXPECT_THROW(eng.submit(reqs), ConfigError);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, testing::ValuesIn(every_config()), config_name);

TEST(IoEngineNames, ParseRoundTripsAndRejectsUnknown) {
  for (IoBackend b : {IoBackend::kAuto, IoBackend::kUring, IoBackend::kPread, IoBackend::kMmap})
    EXPECT_EQ(parse_io_backend(io_backend_name(b)), b);
  EXPECT_THROW(parse_io_backend("aio"), ConfigError);
}

}  // namespace
