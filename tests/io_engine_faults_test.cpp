// The I/O engine under each injected completion outcome (short read, EAGAIN, EINTR, EIO, EOF,
// zero bytes) on both completion-driven backends, its lanes, and the fallbacks when io_uring or
// O_DIRECT is refused. Coalescing and placement: tests/io_engine_test.cpp.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/io_engine.h"
#include "tests/io_engine_fixture.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

using namespace moestream;
using namespace moestream::io_test;

namespace {

// Fault injection through the completion hook: io_uring and pread share the completion logic,
// and both are exercised.
class IoFaultTest : public IoEngineTest {};

TEST_P(IoFaultTest, ShortReadIsResubmitted) {
  IoEngineOptions o = options();
  std::atomic<int> shorted{0};
  o.completion_hook = [&](const CompletionInfo& c) -> int64_t {
    if (c.result > 8192 && c.attempt < 3) {
      ++shorted;
      // Aligned halves keep O_DIRECT resubmissions legal; buffered gets odd sizes too.
      return GetParam().direct ? (c.result / 2) / 4096 * 4096 : c.result / 2 + 1;
    }
    return c.result;
  };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(100000, 0), b(70001, 0);
  std::vector<ReadRequest> reqs{{f, 4096, 100000, a.data()}, {f, 1 << 20, 70001, b.data()}};
  eng.read(reqs);
  EXPECT_EQ(a, content_.substr(4096, 100000));
  EXPECT_EQ(b, content_.substr(1 << 20, 70001));
  EXPECT_GT(shorted.load(), 0);
  EXPECT_EQ(eng.stats().short_reads, static_cast<uint64_t>(shorted.load()));
}

TEST_P(IoFaultTest, ShortScatteredReadResumesInTheRightDest) {
  IoEngineOptions o = options();
  std::atomic<int> shorted{0};
  o.completion_hook = [&](const CompletionInfo& c) -> int64_t {
    if (c.attempt < 2 && c.result > 4096) {
      ++shorted;
      // Stop mid-request (and mid-gap on the second short read); aligned for O_DIRECT.
      int64_t cut = c.attempt == 0 ? 3 * 4096 + (GetParam().direct ? 0 : 100) : 2 * 4096;
      return std::min<int64_t>(c.result, cut);
    }
    return c.result;
  };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::vector<void*> raw(3);
  for (auto& p : raw) ASSERT_EQ(::posix_memalign(&p, 4096, 4 * 4096), 0);
  std::vector<ReadRequest> reqs{{f, 0, 4 * 4096, raw[1]},
                                {f, 6 * 4096, 2 * 4096, raw[2]},
                                {f, 9 * 4096, 4 * 4096, raw[0]}};
  eng.read(reqs);
  for (const ReadRequest& r : reqs)
    EXPECT_EQ(std::string(static_cast<char*>(r.dest), r.length), content_.substr(r.offset, r.length));
  EXPECT_EQ(shorted.load(), 2);
  EXPECT_EQ(eng.stats().scatter_reads, 1u);
  for (auto& p : raw) std::free(p);
}

TEST_P(IoFaultTest, EagainAndEintrAreRetriedWithinTheBound) {
  IoEngineOptions o = options();
  o.max_retries = 4;
  o.completion_hook = [](const CompletionInfo& c) -> int64_t {
    if (c.attempt < 2) return -EAGAIN;
    if (c.attempt < 4) return -EINTR;
    return c.result;
  };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(30000, 0);
  std::vector<ReadRequest> reqs{{f, 777, 30000, a.data()}};
  eng.read(reqs);
  EXPECT_EQ(a, content_.substr(777, 30000));
  EXPECT_EQ(eng.stats().retries, 4u);
}

TEST_P(IoFaultTest, EagainBeyondTheBoundFails) {
  IoEngineOptions o = options();
  o.max_retries = 3;
  std::atomic<int> calls{0};
  o.completion_hook = [&](const CompletionInfo&) -> int64_t { ++calls; return -EAGAIN; };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(5000, 0);
  std::vector<ReadRequest> reqs{{f, 0, 5000, a.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kError);
  EXPECT_EQ(reqs[0].error, EAGAIN);
  EXPECT_EQ(calls.load(), 4);  // the first try and three retries
}

TEST_P(IoFaultTest, OnDoneReportsEachRequestOnceWithItsFinalResult) {
  // Requests split into several extents, coalesced neighbours, one failing chunk: each request
  // is reported exactly once, when its last piece lands, with the result submit() returns.
  IoEngineOptions o = options();
  o.max_read_bytes = 64 << 10;
  const uint64_t bad = (2 << 20) + (64 << 10);
  o.completion_hook = eio_at(bad);
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::vector<std::string> bufs;
  std::vector<ReadRequest> reqs;
  const uint64_t offs[] = {0, 256 << 10, 2 << 20, 3 << 20};  // 0 and 256 KiB coalesce
  for (int i = 0; i < 4; ++i) bufs.emplace_back(256 << 10, '\0');
  for (int i = 0; i < 4; ++i) reqs.push_back({f, offs[i], 256 << 10, bufs[i].data()});
  reqs.push_back({f, 100, 0, bufs[0].data()});  // zero length: reported at once
  std::mutex mu;
  std::vector<int> seen(reqs.size(), 0);
  std::vector<ReadResult> got(reqs.size());
  std::vector<bool> bytes_ok(reqs.size(), false);
  size_t failed = eng.submit(reqs, [&](const ReadRequest& r, size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    ++seen[i];
    got[i] = r.result;
    // The bytes are complete when reported, not only after submit() returns.
    bytes_ok[i] = r.length == 0 || std::memcmp(r.dest, content_.data() + r.offset, r.length) == 0;
  });
  EXPECT_EQ(failed, 1u);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(seen[i], 1) << i;
    EXPECT_EQ(got[i], reqs[i].result) << i;
    if (reqs[i].offset == (2u << 20)) {
      EXPECT_EQ(reqs[i].result, ReadResult::kError);
      EXPECT_EQ(reqs[i].error, EIO);
    } else {
      EXPECT_EQ(reqs[i].result, ReadResult::kOk) << i;
      EXPECT_TRUE(bytes_ok[i]) << i;
    }
  }
}

TEST_P(IoFaultTest, EioFailsOnlyItsRequestsAndNamesFileOffsetLength) {
  IoEngineOptions o = options();
  o.coalesce = false;
  const uint64_t bad_offset = 3 << 20;
  o.completion_hook = eio_at(bad_offset);
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::vector<std::string> bufs(8, std::string(8192, 0));
  std::vector<ReadRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({f, uint64_t(i) << 19, 8192, bufs[i].data()});
  EXPECT_EQ(eng.submit(reqs), 1u);
  for (int i = 0; i < 8; ++i) {
    if (reqs[i].offset == bad_offset) {
      EXPECT_EQ(reqs[i].result, ReadResult::kError);
      EXPECT_EQ(reqs[i].error, EIO);
    } else {
      EXPECT_EQ(reqs[i].result, ReadResult::kOk) << i;  // every other completion was reaped
      EXPECT_EQ(bufs[i], content_.substr(reqs[i].offset, 8192));
    }
  }
  const std::string msg = test::error_message<IoError>([&] { eng.read(reqs); });
  EXPECT_NE(msg.find(path_.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(bad_offset)), std::string::npos) << msg;
  EXPECT_NE(msg.find("length 8192"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EIO)), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 of 8"), std::string::npos) << msg;
}

TEST_P(IoFaultTest, EioInOneChunkOfASplitRequestFailsThatRequestOnly) {
  IoEngineOptions o = options();
  o.max_read_bytes = 64 << 10;
  const uint64_t bad_chunk = (1 << 20) + 2 * (64 << 10);
  o.completion_hook = eio_at(bad_chunk);
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(400000, 0), b(400000, 0);
  std::vector<ReadRequest> reqs{{f, 1 << 20, 400000, a.data()}, {f, 3 << 20, 400000, b.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kError);
  EXPECT_EQ(reqs[0].error, EIO);
  EXPECT_EQ(reqs[1].result, ReadResult::kOk);
  EXPECT_EQ(b, content_.substr(3 << 20, 400000));
  const std::string msg = test::error_message<IoError>([&] { eng.read(reqs); });
  EXPECT_NE(msg.find("offset " + std::to_string(1 << 20) + " length 400000"), std::string::npos) << msg;
}

TEST_P(IoFaultTest, ZeroByteCompletionIsATruncatedFile) {
  IoEngineOptions o = options();
  o.completion_hook = [](const CompletionInfo&) -> int64_t { return 0; };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(5000, 0);
  std::vector<ReadRequest> reqs{{f, 8192, 5000, a.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kTruncated);
  EXPECT_THROW(eng.read(reqs), IoError);
}

TEST_P(IoFaultTest, ShortReadThenEofKeepsTheRequestsThatArrived) {
  IoEngineOptions o = options();
  // One coalesced extent of two requests; the first completion delivers only the first.
  o.completion_hook = [](const CompletionInfo& c) -> int64_t {
    return c.attempt == 0 ? std::min<int64_t>(c.result, 16384) : 0;
  };
  IoEngine eng(o);
  uint32_t f = eng.add_file(path_);
  std::string a(8192, 0), b(8192, 0);
  std::vector<ReadRequest> reqs{{f, 0, 8192, a.data()}, {f, 32768, 8192, b.data()}};
  EXPECT_EQ(eng.submit(reqs), 1u);
  EXPECT_EQ(reqs[0].result, ReadResult::kOk);
  EXPECT_EQ(a, content_.substr(0, 8192));
  EXPECT_EQ(reqs[1].result, ReadResult::kTruncated);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoFaultTest, testing::ValuesIn(completion_configs()), config_name);

TEST_P(IoFaultTest, TwoLanesRunTwoBatchesAtOnceAndOneLaneSerialises) {
  for (uint32_t lanes : {2u, 1u}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    IoEngineOptions o = options();
    o.max_batches_in_flight = lanes;
    auto a_started = std::make_shared<std::atomic<bool>>(false);
    auto b_done = std::make_shared<std::atomic<bool>>(false);
    auto b_seen_by_a = std::make_shared<std::atomic<bool>>(false);
    // Batch A's completion waits for batch B to complete: only possible when B runs while A is
    // still in flight. With two lanes B must get through however loaded the machine is (the
    // 60 s bound only turns a serialising bug into a failure instead of a hang); with one lane B
    // cannot, so a short bound suffices and a slow machine cannot make the check pass wrongly.
    const auto bound = std::chrono::milliseconds(lanes == 2 ? 60000 : 200);
    o.completion_hook = [=](const CompletionInfo& ci) -> int64_t {
      if (ci.offset == 0 && ci.attempt == 0) {
        a_started->store(true);
        auto t0 = std::chrono::steady_clock::now();
        while (!b_done->load() && std::chrono::steady_clock::now() - t0 < bound)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        b_seen_by_a->store(b_done->load());
      }
      return ci.result;
    };
    IoEngine eng(o);
    eng.add_file(path_);
    std::string a(65536, '\0'), b(65536, '\0');
    std::vector<ReadRequest> ra{{0, 0, a.size(), a.data()}}, rb{{0, 1 << 20, b.size(), b.data()}};
    std::thread ta([&] { eng.read(ra); });
    while (!a_started->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    eng.read(rb);
    b_done->store(true);
    ta.join();
    EXPECT_EQ(b_seen_by_a->load(), lanes == 2);
    EXPECT_EQ(a, content_.substr(0, a.size()));
    EXPECT_EQ(b, content_.substr(1 << 20, b.size()));
    EXPECT_EQ(eng.stats().batches, 2u);
  }
}

TEST(IoEngineFallback, UringInitFailureFallsBackToPreadWithANotice) {
  TempDir d("io_fallback");
  std::string content = make_content(50000, 3);
  write_file_atomic(d.path() / "f", content);
  for (IoBackend asked : {IoBackend::kAuto, IoBackend::kUring}) {
    std::vector<std::string> notices;
    IoEngineOptions o;
    o.backend = asked;
    o.simulate_uring_init_errno = EPERM;
    o.notice = [&](const std::string& s) { notices.push_back(s); };
    IoEngine eng(o);
    EXPECT_EQ(eng.backend(), IoBackend::kPread);
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_NE(notices[0].find("io_uring unavailable"), std::string::npos) << notices[0];
    EXPECT_NE(notices[0].find(std::strerror(EPERM)), std::string::npos) << notices[0];
    uint32_t f = eng.add_file(d.path() / "f");
    std::string buf(1000, 0);
    std::vector<ReadRequest> reqs{{f, 10, 1000, buf.data()}};
    eng.read(reqs);
    EXPECT_EQ(buf, content.substr(10, 1000));
  }
}

TEST(IoEngineFallback, RingThatRefusesSubmissionsFinishesItsReadsWithPread) {
  if (!io_uring_available()) MOESTREAM_SKIP_OR_FAIL() << "io_uring_queue_init fails here";
  TempDir d("io_fallback");
  std::string content = make_content(300000, 6);
  write_file_atomic(d.path() / "f", content);
  std::vector<std::string> notices;
  IoEngineOptions o;
  o.backend = IoBackend::kUring;
  o.n_rings = 2;
  o.max_retries = 2;
  o.simulate_submit_errno = ENOMEM;
  o.coalesce = false;  // twelve reads spread over both rings
  o.notice = [&](const std::string& s) { notices.push_back(s); };
  IoEngine eng(o);
  uint32_t f = eng.add_file(d.path() / "f");
  for (int round = 0; round < 2; ++round) {  // the second batch runs on the re-made rings
    std::vector<std::string> bufs(12, std::string(10000, 0));
    std::vector<ReadRequest> reqs;
    for (int i = 0; i < 12; ++i) reqs.push_back({f, uint64_t(i) * 24000, 10000, bufs[i].data()});
    eng.read(reqs);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(bufs[i], content.substr(i * 24000, 10000)) << i;
  }
  ASSERT_FALSE(notices.empty());
  EXPECT_NE(notices[0].find(std::strerror(ENOMEM)), std::string::npos) << notices[0];
}

// Page-cache hits are copied inside the submission, so a ring that took its whole share of a
// batch at once was committed to it while the other rings ran dry. Each ring now takes one read
// at a time: while one ring is held up on its first read, the other reads the rest.
TEST(IoEngineUring, RingHeldUpOnOneReadLeavesTheRestToTheOtherRing) {
  if (!io_uring_available()) MOESTREAM_SKIP_OR_FAIL() << "io_uring_queue_init fails here";
  TempDir d("io_uring_balance");
  std::string content = make_content(1 << 20, 8);
  write_file_atomic(d.path() / "f", content);  // just written: every read hits the page cache
  std::mutex mu;
  std::condition_variable cv;
  std::thread::id held;
  std::map<std::thread::id, int> reads;  // completions per ring thread
  IoEngineOptions o;
  o.backend = IoBackend::kUring;
  o.n_rings = 2;
  o.coalesce = false;  // four reads, a share of two per ring
  o.completion_hook = [&](const CompletionInfo& c) {
    std::unique_lock<std::mutex> lock(mu);
    const std::thread::id me = std::this_thread::get_id();
    ++reads[me];
    if (held == std::thread::id{}) {
      held = me;  // the first ring to complete a read stalls until the other has read 3
      cv.wait_for(lock, std::chrono::seconds(5), [&] {
        int other = 0;
        for (auto& [id, n] : reads)
          if (id != me) other += n;
        return other >= 3;
      });
    } else {
      cv.notify_all();
    }
    return c.result;
  };
  IoEngine eng(o);
  uint32_t f = eng.add_file(d.path() / "f");
  std::vector<std::string> bufs(4, std::string(4096, 0));
  std::vector<ReadRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back({f, uint64_t(i) * 200000, 4096, bufs[i].data()});
  eng.read(reqs);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bufs[i], content.substr(i * 200000, 4096)) << i;
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[held], 1);
}

TEST(IoEngineFallback, AutoPicksUringWhenItWorks) {
  if (!io_uring_available()) MOESTREAM_SKIP_OR_FAIL() << "io_uring_queue_init fails here";
  std::vector<std::string> notices;
  IoEngineOptions o;
  o.notice = [&](const std::string& s) { notices.push_back(s); };
  IoEngine eng(o);
  EXPECT_EQ(eng.backend(), IoBackend::kUring);
  EXPECT_TRUE(notices.empty());
}

TEST(IoEngineFallback, ExplicitPreadAndMmapAreHonoured) {
  IoEngineOptions o;
  o.backend = IoBackend::kPread;
  EXPECT_EQ(IoEngine(o).backend(), IoBackend::kPread);
  o.backend = IoBackend::kMmap;
  EXPECT_EQ(IoEngine(o).backend(), IoBackend::kMmap);
}

TEST(IoEngineFallback, RefusedDirectFallsBackToBufferedWithANotice) {
  TempDir d("io_fallback");
  std::string content = make_content(50000, 4);
  write_file_atomic(d.path() / "f", content);
  for (IoBackend b : {IoBackend::kPread, IoBackend::kUring}) {
    if (b == IoBackend::kUring && !io_uring_available()) continue;
    std::vector<std::string> notices;
    IoEngineOptions o;
    o.backend = b;
    o.direct = true;
    o.simulate_direct_errno = EINVAL;
    o.notice = [&](const std::string& s) { notices.push_back(s); };
    IoEngine eng(o);
    uint32_t f = eng.add_file(d.path() / "f");
    EXPECT_FALSE(eng.file_is_direct(f));
    ASSERT_EQ(notices.size(), 1u);
    EXPECT_NE(notices[0].find("O_DIRECT refused"), std::string::npos) << notices[0];
    EXPECT_NE(notices[0].find((d.path() / "f").string()), std::string::npos) << notices[0];
    std::string buf(777, 0);
    std::vector<ReadRequest> reqs{{f, 33, 777, buf.data()}};
    eng.read(reqs);
    EXPECT_EQ(buf, content.substr(33, 777));
  }
}

TEST(IoEngineFallback, DirectRefusedByTheFilesystemFallsBackToBuffered) {
  // /dev/shm is tmpfs; older kernels refuse O_DIRECT there, newer ones accept it.
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  std::string path = "/dev/shm/moestream_io_test_" + std::to_string(::getpid());
  write_file_atomic(path, make_content(20000, 5));
  int probe = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  bool refused = probe < 0;
  if (probe >= 0) ::close(probe);
  std::vector<std::string> notices;
  IoEngineOptions o;
  o.backend = IoBackend::kPread;
  o.direct = true;
  o.notice = [&](const std::string& s) { notices.push_back(s); };
  {
    IoEngine eng(o);
    uint32_t f = eng.add_file(path);
    std::string buf(100, 0);
    std::vector<ReadRequest> reqs{{f, 5, 100, buf.data()}};
    eng.read(reqs);
    EXPECT_EQ(buf, make_content(20000, 5).substr(5, 100));
    if (refused) {
      EXPECT_FALSE(eng.file_is_direct(f));
      ASSERT_EQ(notices.size(), 1u);
      EXPECT_NE(notices[0].find("O_DIRECT"), std::string::npos);
    }
  }
  ::unlink(path.c_str());
  if (!refused) GTEST_SKIP() << "tmpfs accepts O_DIRECT on this kernel; the refusal path is not reachable";
}

}  // namespace
