// common/mapping_guard.h: a page of a registered mapping that cannot be read (the file truncated
// under the process) is a recorded fault that check() names, not a dead process; a file changed
// in place is refused; a fault outside every registered mapping still kills the process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "common/mapped_file.h"
#include "common/mapping_guard.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBytes = 64 * 4096;

fs::path write_file(const fs::path& dir, const std::string& name, size_t bytes) {
  const fs::path p = dir / name;
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = char(1 + i % 251);  // never zero
  std::ofstream(p, std::ios::binary).write(data.data(), std::streamsize(bytes));
  return p;
}

std::string message_of(const MappedFile& f) {
  try {
    f.check();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(MappingGuard, TruncatedFileReadsZerosAndCheckNamesFileAndOffset) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "weights.bin", kBytes);
  MappedFile f(p);
  const volatile uint8_t* bytes = f.range(0, kBytes, "all");
  EXPECT_EQ(bytes[kBytes - 1], 1 + (kBytes - 1) % 251);
  ASSERT_EQ(::truncate(p.c_str(), kBytes / 2), 0);
  const uint64_t before = mapped_fault_count();
  // The page past the new end raises SIGBUS; the handler maps zeros over it and returns.
  EXPECT_EQ(bytes[kBytes / 2 + 10], 0);
  EXPECT_EQ(bytes[kBytes - 1], 0);
  EXPECT_GE(mapped_fault_count(), before + 1);
  const std::string msg = message_of(f);
  EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("at offset " + std::to_string(kBytes / 2 + 10)), std::string::npos) << msg;
  EXPECT_NE(msg.find("SIGBUS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated from " + std::to_string(kBytes) + " to " + std::to_string(kBytes / 2)), std::string::npos) << msg;
  EXPECT_THROW(check_mapped_files(0), IoError);
}

TEST(MappingGuard, UnmappedFileNoLongerFailsTheProcessWideCheck) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "weights.bin", kBytes);
  {
    MappedFile f(p);
    ASSERT_EQ(::truncate(p.c_str(), 0), 0);
    EXPECT_EQ(static_cast<const volatile uint8_t*>(f.range(0, kBytes, "all"))[100], 0);
    EXPECT_THROW(check_mapped_files(0), IoError);
  }
  EXPECT_NO_THROW(check_mapped_files(0));
}

TEST(MappingGuard, FileRewrittenInPlaceIsRefused) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "weights.bin", kBytes);
  const timespec old[2] = {{1000, 0}, {1000, 0}};  // an mtime the rewrite cannot share
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), old, 0), 0);
  MappedFile f(p);
  EXPECT_NO_THROW(f.check());
  {
    std::fstream out(p, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(4096);
    out.put('x');
  }
  const std::string msg = message_of(f);
  EXPECT_NE(msg.find(p.string() + ": the file changed while this process had it mapped"), std::string::npos) << msg;
}

TEST(MappingGuard, FileReplacedByRenameIsRefused) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "weights.bin", kBytes);
  MappedFile f(p);
  const fs::path q = write_file(dir.path(), "new.bin", kBytes);
  fs::rename(q, p);
  const std::string msg = message_of(f);
  EXPECT_NE(msg.find("the file was replaced"), std::string::npos) << msg;
}

TEST(MappingGuard, EachOwnerChecksItsOwnMappingsOnly) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "weights.bin", kBytes);
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), old, 0), 0);
  const uint64_t first = new_mapping_owner(), second = new_mapping_owner();
  std::unique_ptr<MappedFile> stale;
  {
    const MappingOwnerScope scope(first);
    stale = std::make_unique<MappedFile>(p);
  }
  EXPECT_EQ(current_mapping_owner(), 0u);
  { std::fstream(p, std::ios::in | std::ios::out | std::ios::binary).put('x'); }
  const MappingOwnerScope scope(second);  // a second model loaded after the change
  MappedFile fresh(p);
  EXPECT_NO_THROW(check_mapped_files(second));
  EXPECT_THROW(check_mapped_files(first), IoError);
}

// A fault the guard does not own goes on to the handler installed before it: none in a plain
// build (the process dies of SIGBUS), AddressSanitizer's in the asan job (which reports the fault
// and aborts, or exits 1, as ASAN_OPTIONS say). Had the guard swallowed it, the read would give a
// zero page's 0 and the child would exit 0.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif
bool killed_as_without_the_guard(int status) {
  if (kAsan) return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
}

TEST(MappingGuardDeathTest, FaultOutsideEveryRegisteredMappingStillKillsWithSigbus) {
  TempDir dir;
  const fs::path p = write_file(dir.path(), "other.bin", kBytes);
  const fs::path guarded = write_file(dir.path(), "guarded.bin", kBytes);
  MappedFile keep(guarded);  // the handler is installed
  EXPECT_EXIT(
      {
        const int fd = ::open(p.c_str(), O_RDONLY);
        auto* m = static_cast<const volatile uint8_t*>(::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0));
        if (::ftruncate(::open(p.c_str(), O_WRONLY), 0) != 0) std::_Exit(3);
        std::_Exit(m[kBytes - 1]);  // SIGBUS: not a registered mapping
      },
      killed_as_without_the_guard, "");
}

}  // namespace
}  // namespace moestream
