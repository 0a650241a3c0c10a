// Tests of common/: atomic writes and the RAII temp dir.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/file_util.h"
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
