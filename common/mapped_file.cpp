// Implementation of common/mapped_file.h.
#include "common/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  uint64_t bytes = 0;
  const int fd = open_for_read(path, "file to map", &bytes);
  struct stat st {};
  if (::fstat(fd, &st) != 0) close_and_throw_errno(fd, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(path.string() + ": not a regular file, cannot be mapped");
  }
  if (bytes > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) close_and_throw_errno(fd, "cannot mmap", path);
    data_ = static_cast<const uint8_t*>(m);
    size_ = bytes;
    try {
      guard_ = MappingGuard(data_, size_, path, fd);
    } catch (...) {
      ::munmap(m, static_cast<size_t>(bytes));
      ::close(fd);
      throw;
    }
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  guard_ = MappingGuard();  // no fault may be taken for this range once it is unmapped
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

const uint8_t* MappedFile::range(uint64_t offset, uint64_t n, const std::string& what) const {
  if (offset > size_ || n > size_ - offset)
    throw FormatError(path_.string() + ": " + what + " at bytes [" + std::to_string(offset) + ", +" +
                      std::to_string(n) + ") lies outside the file (" + std::to_string(size_) + " bytes)");
  return data_ + offset;
}

}  // namespace moestream
