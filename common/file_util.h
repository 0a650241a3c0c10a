// Small file helpers every module needs: whole-file reads with clear errors, atomic writes
// (temp file, fsync, rename) so a crash never leaves a half-written user file, RAII temp dirs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace moestream {

// Files read whole are at most this large unless the caller states another limit (1 GiB: the
// largest tokenizer.json or text file moestream reads is far smaller).
inline constexpr uint64_t kReadFileLimit = uint64_t(1) << 30;

// Reads the whole file; throws IoError naming the path and strerror on failure, and IoError when
// the path is a directory or a device (/dev/zero would be read until memory runs out) or holds
// more than `max_bytes` (a pipe is read up to the limit, then refused). Opening a FIFO never
// blocks: one without a writer reads as empty.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = kReadFileLimit);

// Writes `data` to `path` atomically: `path.tmp.<pid>`, fsync, rename, fsync of the directory.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

// Writes all `n` bytes at `offset` (retrying short writes and EINTR); throws IoError naming
// `path` and the offset.
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::filesystem::path& path);

// fsyncs a file or directory by path; throws IoError on failure.
void fsync_path(const std::filesystem::path& path);

// Throws IoError("<what> <path>: <strerror(errno)>").
[[noreturn]] void throw_errno(const std::string& what, const std::filesystem::path& path);

// Closes fd, then throws as throw_errno with the errno from before the close.
[[noreturn]] void close_and_throw_errno(int fd, const std::string& what, const std::filesystem::path& path);

// Opens `path` read-only (close-on-exec) and stores its size in *size; throws IoError
// ("cannot open <what> <path>: ..." or "cannot stat <path>: ...", or "...: not a regular file"
// for a FIFO, socket or device, which is refused without blocking on it).
int open_for_read(const std::filesystem::path& path, const std::string& what, uint64_t* size);

// A fresh directory under $TMPDIR (or /tmp), removed with its content on destruction.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "moestream");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace moestream
