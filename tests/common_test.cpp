// Tests of common/: checked conversions, whole-file reads, atomic writes, the RAII temp dir and the
// thread pool (sections and posted tasks), the memory room.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <new>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/checked.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/memory_room.h"
#include "common/thread_pool.h"

namespace fs = std::filesystem;
using namespace moestream;

TEST(TempDir, IsRemovedWithItsContent) {
  fs::path p;
  {
    TempDir d("common_test");
    p = d.path();
    ASSERT_TRUE(fs::is_directory(p));
    write_file_atomic(p / "a.txt", "hello");
  }
  EXPECT_FALSE(fs::exists(p));
}

TEST(AtomicWrite, ReplacesContentAndLeavesNoTempFile) {
  TempDir d;
  write_file_atomic(d.path() / "f", "first");
  write_file_atomic(d.path() / "f", "second");
  EXPECT_EQ(read_file(d.path() / "f"), "second");
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path())) { (void)e; ++n; }
  EXPECT_EQ(n, 1);
}

TEST(AtomicWrite, FailureLeavesOriginalUntouched) {
  TempDir d;
  write_file_atomic(d.path() / "f", "original");
  EXPECT_THROW(write_file_atomic(d.path() / "missing_dir" / "f", "x"), IoError);
  EXPECT_EQ(read_file(d.path() / "f"), "original");
}

// The ConfigError message of fn(); empty (and a test failure) when it throws none.
template <class F>
std::string config_error_of(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Checked, RangeNamesTheOptionItsBoundsAndTheValue) {
  EXPECT_EQ(check_range("--ctx", 0, 0, 10), 0);
  EXPECT_EQ(check_range("--ctx", 10, 0, 10), 10);
  const std::string msg = config_error_of([] { check_range("--ctx", -5, 0, 10); });
  EXPECT_TRUE(has(msg, "--ctx") && has(msg, "[0, 10]") && has(msg, "-5")) << msg;
  EXPECT_TRUE(has(config_error_of([] { check_range<uint64_t>("io_qd", 11, 1, 10); }), "io_qd"));
}

TEST(Checked, NanAndInfinityAreRefusedThoughEveryComparisonLetsNanThrough) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string msg = config_error_of([&] { check_range("--cache-tolerance", nan, 0.0f, 1000.0f); });
  EXPECT_TRUE(has(msg, "--cache-tolerance") && has(msg, "nan")) << msg;
  EXPECT_THROW(check_range("x", std::numeric_limits<double>::infinity(), 0.0, 1e300), ConfigError);
  EXPECT_THROW(check_range("x", -std::numeric_limits<double>::infinity(), -1e300, 0.0), ConfigError);
  EXPECT_FLOAT_EQ(check_range("x", 0.25f, 0.0f, 1.0f), 0.25f);
}

TEST(Checked, UnitConversionsRefuseToWrap) {
  EXPECT_EQ(kib_to_bytes(3, "--max-read-kb"), 3u * 1024);
  EXPECT_EQ(mib_to_bytes(5, "--host-cache-mb"), 5u << 20);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(mib_to_bytes(max >> 20, "m"), (max >> 20) << 20);  // the largest that fits
  // 2^64 - 1 MiB shifted would wrap to a small number and silently disable the host cache.
  const std::string msg = config_error_of([&] { mib_to_bytes(max, "--host-cache-mb"); });
  EXPECT_TRUE(has(msg, "--host-cache-mb") && has(msg, std::to_string(max))) << msg;
  EXPECT_THROW(mib_to_bytes((max >> 20) + 1, "m"), ConfigError);
  EXPECT_THROW(kib_to_bytes((max >> 10) + 1, "--coalesce-gap-kb"), ConfigError);
}

TEST(Checked, ProductsThatOverflowNameWhatTheySize) {
  EXPECT_EQ(checked_product({2, 3, 7}, "x"), 42u);
  EXPECT_EQ(checked_product({}, "x"), 1u);
  const std::string msg = config_error_of([] { checked_product({uint64_t(1) << 40, uint64_t(1) << 30, 0}, "the KV cache"); });
  EXPECT_TRUE(has(msg, "the KV cache") && has(msg, "overflows")) << msg;  // a later 0 does not hide it
}

TEST(Checked, AllocationFailureNamesWhatHowManyBytesAndTheSource) {
  const std::string msg = config_error_of([] {
    allocating("the KV cache", uint64_t(3) << 20, "--ctx 99", []() -> int { throw std::bad_alloc(); });
  });
  EXPECT_TRUE(has(msg, "the KV cache") && has(msg, "3145728 bytes") && has(msg, "--ctx 99")) << msg;
  EXPECT_EQ(allocating("x", 1, "y", [] { return 7; }), 7);
}

TEST(ReadFile, DevicesAndDirectoriesAreRefusedNotReadUntilMemoryRunsOut) {
  const std::string msg = [] {
    try {
      read_file("/dev/zero");
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no IoError");
  }();
  EXPECT_TRUE(has(msg, "/dev/zero") && has(msg, "not a regular file")) << msg;
  TempDir d;
  EXPECT_THROW(read_file(d.path()), IoError);
}

TEST(ReadFile, FilesOverTheLimitAreRefusedWithThePathAndTheLimit) {
  TempDir d;
  write_file_atomic(d.path() / "f", std::string(100, 'x'));
  EXPECT_EQ(read_file(d.path() / "f", 100).size(), 100u);
  try {
    read_file(d.path() / "f", 99);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_TRUE(has(e.what(), (d.path() / "f").string()) && has(e.what(), "99-byte limit")) << e.what();
  }
}

TEST(ReadFile, MissingFileNamesThePath) {
  try {
    read_file("/nonexistent/moestream/file");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/moestream/file"), std::string::npos);
  }
}

TEST(ThreadPool, OnEachThreadRunsOnceOnEveryThreadCallerIncluded) {
  for (int n : {1, 2, 5}) {
    ThreadPool pool(n);
    for (int round = 0; round < 20; ++round) {  // workers asleep or spinning alike
      std::mutex mu;
      std::multiset<std::thread::id> ran;
      pool.on_each_thread([&] {
        std::lock_guard<std::mutex> lock(mu);
        ran.insert(std::this_thread::get_id());
      });
      ASSERT_EQ(ran.size(), size_t(n));
      EXPECT_EQ(std::set<std::thread::id>(ran.begin(), ran.end()).size(), size_t(n));
      EXPECT_EQ(ran.count(std::this_thread::get_id()), 1u);
    }
  }
}

TEST(ThreadPool, PostedTasksRunOnceEachAndRunPostedWaitsForAll) {
  for (int n : {1, 2, 5}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> hits(40);
    for (size_t i = 0; i < hits.size(); ++i)
      pool.post([&hits, i] {
        volatile long x = 0;  // long enough that some are still running when run_posted starts
        for (int k = 0; k < 200000; ++k) x = x + k;
        hits[i].fetch_add(1);
      });
    std::atomic<int> section{0};
    for (int rep = 0; rep < 50; ++rep) pool.parallel_for(8, [&](size_t) { section.fetch_add(1); });
    pool.run_posted();
    for (size_t i = 0; i < hits.size(); ++i)
      ASSERT_EQ(hits[i].load(), 1) << "posted task " << i << ", " << n << " threads";
    EXPECT_EQ(section.load(), 400);
    pool.run_posted();  // nothing left: returns at once
  }
}

TEST(ThreadPool, APostedTaskFillsAThreadThatASectionLeavesIdle) {
  // Three threads, a section of two tasks that each wait for the posted task to start. When the
  // caller claims one of them, the worker left without a task must start the posted one (the
  // caller runs posted tasks only in run_posted). When both workers claim them first, no thread
  // is idle and the tasks give up: that ordering proves nothing, so the test tries again (the
  // workers asleep each time, as between decode steps) until it has seen the first.
  ThreadPool pool(3);
  const std::thread::id caller = std::this_thread::get_id();
  int observed = 0;
  for (int attempt = 0; attempt < 200 && observed < 3; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the workers go back to sleep
    std::atomic<bool> started{false};
    std::atomic<std::thread::id> ran_on{};
    pool.post([&] {
      ran_on.store(std::this_thread::get_id());
      started.store(true);
    });
    std::atomic<bool> caller_claimed{false};
    std::atomic<int> claimed{0}, timed_out{0};
    pool.parallel_for(2, [&](size_t) {
      if (std::this_thread::get_id() == caller) caller_claimed.store(true);
      claimed.fetch_add(1);  // after caller_claimed: whoever sees 2 sees who claimed
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!started.load()) {
        if (claimed.load() == 2 && !caller_claimed.load()) return;  // both on workers: none idle
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out.fetch_add(1);
          return;
        }
      }
    });
    const bool caller_took_one = caller_claimed.load(), started_in_section = started.load();
    pool.run_posted();
    ASSERT_TRUE(started.load());
    if (!caller_took_one) continue;
    EXPECT_TRUE(started_in_section) << "the posted task did not start during the section";
    EXPECT_EQ(timed_out.load(), 0);
    EXPECT_NE(ran_on.load(), caller) << "the caller ran a posted task outside run_posted";
    ++observed;
  }
  EXPECT_GT(observed, 0) << "the caller never claimed a task of the section in 200 tries";
}

TEST(ThreadPool, RunPostedRethrowsAPostedTasksException) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  pool.post([&] { ran.fetch_add(1); });
  pool.post([] { throw std::runtime_error("posted task failed"); });
  pool.post([&] { ran.fetch_add(1); });
  EXPECT_THROW(pool.run_posted(), std::runtime_error);
  EXPECT_EQ(ran.load(), 2);
  pool.post([&] { ran.fetch_add(1); });
  pool.run_posted();  // the error was reported once
  EXPECT_EQ(ran.load(), 3);
}

// The memory room (common/memory_room.h) on fake /proc and /sys trees.
TEST(MemoryRoom, ParsesMeminfoMemoryStatAndTheCgroupOfThisProcess) {
  EXPECT_EQ(meminfo_available("MemTotal: 100 kB\nMemFree:  5 kB\nMemAvailable:   2048 kB\n"), uint64_t(2048) * 1024);
  EXPECT_FALSE(meminfo_available("MemTotal: 100 kB\n").has_value());
  EXPECT_FALSE(meminfo_available("MemAvailable: lots kB\n").has_value());
  EXPECT_EQ(memory_stat_value("anon 10\nfile 300\nfile_mapped 7\n", "file"), 300u);
  EXPECT_EQ(memory_stat_value("cache 5\ntotal_cache 9\n", "total_cache"), 9u);
  EXPECT_FALSE(memory_stat_value("file_mapped 7\n", "file").has_value());
  const char* v1 = "12:blkio:/a\n4:cpu,cpuacct:/b\n3:memory:/cap-1\n0::/\n";
  EXPECT_EQ(cgroup_of(v1, false), "/cap-1");
  EXPECT_EQ(cgroup_of(v1, true), "/");
  EXPECT_EQ(cgroup_of("0::/user.slice/run-7.scope\n", true), "/user.slice/run-7.scope");
  EXPECT_FALSE(cgroup_of("0::/x\n", false).has_value());
  EXPECT_FALSE(cgroup_of("garbage\n", true).has_value());
}

namespace {
void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  write_file_atomic(p, text);
}
}  // namespace

TEST(MemoryRoom, TheTightestOfMemAvailableAndEveryLimitedCgroupUpTheTree) {
  const uint64_t mib = uint64_t(1) << 20;
  {  // cgroup v2: the child's limit less its anonymous memory (current less file pages)
    TempDir root("room");
    put(root.path() / "proc/meminfo", "MemAvailable: " + std::to_string(4096 * 1024) + " kB\n");  // 4 GiB
    put(root.path() / "proc/self/cgroup", "0::/a/b\n");
    const fs::path cg = root.path() / "sys/fs/cgroup";
    put(cg / "a/memory.max", std::to_string(3000 * mib) + "\n");
    put(cg / "a/memory.current", std::to_string(100 * mib) + "\n");
    put(cg / "a/memory.stat", "anon 1\nfile 0\n");
    put(cg / "a/b/memory.max", std::to_string(1263 * mib) + "\n");
    put(cg / "a/b/memory.current", std::to_string(900 * mib) + "\n");
    put(cg / "a/b/memory.stat", "anon 5\nfile " + std::to_string(800 * mib) + "\n");
    auto r = memory_room(root.path());
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->bytes, 1163 * mib);  // 1263 - (900 - 800)
    EXPECT_EQ(r->source, "cgroup v2 /a/b (memory.max 1263 MiB)");
    put(cg / "a/b/memory.max", "max\n");  // unlimited child: the parent bounds it
    r = memory_room(root.path());
    EXPECT_EQ(r->bytes, 2900 * mib);
    EXPECT_EQ(r->source, "cgroup v2 /a (memory.max 3000 MiB)");
    put(cg / "a/memory.max", "max\n");  // no limit anywhere: MemAvailable
    r = memory_room(root.path());
    EXPECT_EQ(r->bytes, 4096 * mib);
    EXPECT_EQ(r->source, "MemAvailable");
  }
  {  // cgroup v1: limit_in_bytes less (usage - total_cache); PAGE_COUNTER_MAX is no limit
    TempDir root("room");
    put(root.path() / "proc/meminfo", "MemAvailable: " + std::to_string(4096 * 1024) + " kB\n");
    put(root.path() / "proc/self/cgroup", "5:memory:/cap\n0::/\n");
    const fs::path cg = root.path() / "sys/fs/cgroup/memory";
    put(cg / "memory.limit_in_bytes", "9223372036854771712\n");
    put(cg / "cap/memory.limit_in_bytes", std::to_string(500 * mib) + "\n");
    put(cg / "cap/memory.usage_in_bytes", std::to_string(600 * mib) + "\n");  // over: room 0
    put(cg / "cap/memory.stat", "cache 1\ntotal_cache 0\n");
    auto r = memory_room(root.path());
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->bytes, 0u);
    EXPECT_EQ(r->source, "cgroup v1 /cap (memory.limit_in_bytes 500 MiB)");
  }
  TempDir empty("room");
  EXPECT_FALSE(memory_room(empty.path()).has_value());
  const auto live = memory_room();  // this machine: at least MemAvailable is readable on Linux
  ASSERT_TRUE(live.has_value());
  EXPECT_GT(live->bytes, 0u);
}
