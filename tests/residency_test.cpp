// Tests of loader/io/residency.h: a range is resident after it is read and not after
// POSIX_FADV_DONTNEED, with cachestat(2) and with the mincore fallback, and both agree.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/residency.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

constexpr uint64_t kBytes = 2 << 20;

class ResidencyTest : public testing::TestWithParam<ResidencyMethod> {
 protected:
  void SetUp() override {
    if (GetParam() == ResidencyMethod::kCachestat && !cachestat_supported())
      GTEST_SKIP() << "cachestat(2) not available on this kernel";
    path_ = dir_.path() / "f.bin";
    std::string s(kBytes, '\0');
    for (uint64_t i = 0; i < kBytes; ++i) s[i] = static_cast<char>(i * 31 + 7);
    write_file_atomic(path_, s);  // fsync'ed, so the pages are clean and DONTNEED drops them
    fd_ = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void drop() { ASSERT_EQ(::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED), 0); }
  void read_range(uint64_t off, uint64_t len) {
    std::string buf(len, 0);
    ASSERT_EQ(::pread(fd_, buf.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
  }

  TempDir dir_{"residency_test"};
  fs::path path_;
  int fd_ = -1;
};

TEST_P(ResidencyTest, DroppedRangeIsNotResidentAndReadRangeIs) {
  PageCacheResidency probe(path_, GetParam());
  EXPECT_EQ(probe.method(), GetParam());
  drop();
  RangeResidency all = probe.query(0, kBytes);
  EXPECT_EQ(all.pages, kBytes / 4096);
  EXPECT_EQ(all.resident_pages, 0u);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);  // no readahead: only what is read gets cached
  read_range(1 << 20, 256 << 10);
  RangeResidency hot = probe.query(1 << 20, 256 << 10);
  EXPECT_TRUE(hot.fully_resident()) << hot.resident_pages << "/" << hot.pages;
  RangeResidency cold = probe.query(0, 512 << 10);
  EXPECT_EQ(cold.resident_pages, 0u);
  drop();
  EXPECT_EQ(probe.query(1 << 20, 256 << 10).resident_pages, 0u);
}

TEST_P(ResidencyTest, BatchQueryMatchesSingleQueries) {
  PageCacheResidency probe(path_, GetParam());
  drop();
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  read_range(0, 64 << 10);
  read_range(1 << 20, 64 << 10);
  std::vector<ByteRange> ranges{{0, 64 << 10}, {100, 5000}, {512 << 10, 64 << 10}, {1 << 20, 64 << 10}};
  std::vector<RangeResidency> out(ranges.size());
  probe.query(ranges, out);
  for (size_t i = 0; i < ranges.size(); ++i) {
    RangeResidency one = probe.query(ranges[i].offset, ranges[i].length);
    EXPECT_EQ(out[i].pages, one.pages);
    EXPECT_EQ(out[i].resident_pages, one.resident_pages);
  }
  EXPECT_TRUE(out[0].fully_resident());
  EXPECT_EQ(out[1].pages, 2u);  // [100, 5100) touches two pages
  EXPECT_EQ(out[2].resident_pages, 0u);
  EXPECT_TRUE(out[3].fully_resident());
}

TEST_P(ResidencyTest, SampleLooksAtFewPagesAndSeesResidency) {
  PageCacheResidency probe(path_, GetParam());
  drop();
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  RangeResidency cold = probe.sample(0, 1 << 20, 4);
  EXPECT_EQ(cold.pages, 4u);
  EXPECT_EQ(cold.resident_pages, 0u);
  read_range(0, 1 << 20);
  RangeResidency hot = probe.sample(0, 1 << 20, 4);
  EXPECT_EQ(hot.pages, 4u);
  EXPECT_EQ(hot.resident_pages, 4u);
  // Only the last page cached: the sample includes the last page, so it sees it.
  drop();
  read_range((1 << 20) + 4096 * 63, 4096);
  RangeResidency tail = probe.sample(1 << 20, 64 * 4096, 4);
  EXPECT_EQ(tail.resident_pages, 1u);
  // A range shorter than the sample is counted exactly.
  EXPECT_EQ(probe.sample(0, 2 * 4096, 8).pages, 2u);
}

TEST_P(ResidencyTest, RangePastEndOfFileIsClipped) {
  PageCacheResidency probe(path_, GetParam());
  RangeResidency r = probe.query(kBytes - 4096, 1 << 20);
  EXPECT_EQ(r.pages, 1u);
  EXPECT_EQ(probe.query(kBytes + 4096, 4096).pages, 0u);
}

INSTANTIATE_TEST_SUITE_P(Methods, ResidencyTest,
                         testing::Values(ResidencyMethod::kCachestat, ResidencyMethod::kMincore),
                         [](const auto& info) { return std::string(residency_method_name(info.param)); });

TEST(Residency, MethodsAgreeOnAPartlyCachedFile) {
  if (!cachestat_supported()) GTEST_SKIP() << "cachestat(2) not available on this kernel";
  TempDir d("residency_test");
  std::string s(kBytes, 'x');
  write_file_atomic(d.path() / "f", s);
  int fd = ::open((d.path() / "f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  std::string buf(4096, 0);
  for (uint64_t off = 0; off < kBytes; off += 3 * 4096) ::pread(fd, buf.data(), 4096, off);
  PageCacheResidency a(d.path() / "f", ResidencyMethod::kCachestat);
  PageCacheResidency b(d.path() / "f", ResidencyMethod::kMincore);
  for (uint64_t off : {uint64_t{0}, uint64_t{12345}, uint64_t{1 << 20}}) {
    RangeResidency x = a.query(off, 300000), y = b.query(off, 300000);
    EXPECT_EQ(x.pages, y.pages);
    EXPECT_EQ(x.resident_pages, y.resident_pages) << "offset " << off;
    EXPECT_GT(x.resident_pages, 0u);
    EXPECT_LT(x.resident_pages, x.pages);
  }
  ::close(fd);
}

TEST(Residency, MissingFileNamesThePath) {
  try {
    PageCacheResidency p("/nonexistent/moestream/layer_000.bin");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/moestream/layer_000.bin"), std::string::npos);
  }
}

}  // namespace
