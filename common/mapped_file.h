// A read-only shared mapping of a whole file: weights computed in place from the page cache, as
// stored, with no private copy (the pages stay reclaimable; several processes share them).
// Registered with common/mapping_guard.h: a page that cannot be read is a recorded fault, not a
// dead process, and check() says so (or that the file changed since it was mapped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/mapping_guard.h"

namespace moestream {

class MappedFile {
 public:
  // Maps `path` whole (PROT_READ, MAP_SHARED); IoError naming the file when it cannot be opened,
  // is not a regular file, or cannot be mapped. An empty file maps to no bytes.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  // The bytes [offset, offset + n) of the file; FormatError naming the file, `what` and the range
  // when they do not lie inside it (offsets come from file headers: never trusted).
  const uint8_t* range(uint64_t offset, uint64_t n, const std::string& what) const;
  // IoError naming the file and offset when a page of the mapping faulted, or the file changed
  // (size, mtime, inode) since it was mapped.
  void check() const { guard_.check(); }

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  MappingGuard guard_;  // unregistered before the destructor's munmap (declared last)
};

}  // namespace moestream
