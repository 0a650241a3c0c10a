// Implementation of common/file_util.h and of the assertion handler.
#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "common/error.h"

namespace moestream {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "moestream: assertion failed at %s:%d: %s%s%s\n", file, line, expr,
               msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}

void throw_errno(const std::string& what, const std::filesystem::path& path) {
  throw IoError(what + " " + path.string() + ": " + std::strerror(errno));
}

void close_and_throw_errno(int fd, const std::string& what, const std::filesystem::path& path) {
  const int saved = errno;
  ::close(fd);
  errno = saved;
  throw_errno(what, path);
}

namespace {
// open(2) of a FIFO blocks until a writer comes, possibly forever: open without blocking, then
// restore blocking reads for what the caller does with the descriptor.
int open_rdonly(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) close_and_throw_errno(fd, "cannot open", path);
  }
  return fd;
}
}  // namespace

int open_for_read(const std::filesystem::path& path, const std::string& what, uint64_t* size) {
  const int fd = open_rdonly(path);
  if (fd < 0) throw_errno("cannot open " + what, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) close_and_throw_errno(fd, "cannot stat", path);
  // Sizes and offsets of these files are read from the file and checked against its size: only a
  // regular file has one (a FIFO or device would report 0 or block).
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("cannot open " + what + " " + path.string() + ": not a regular file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  int fd = open_rdonly(path);
  if (fd < 0) throw_errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) close_and_throw_errno(fd, "cannot stat", path);
  const auto too_large = [&] {
    ::close(fd);
    throw IoError(path.string() + ": larger than the " + std::to_string(max_bytes) +
                  "-byte limit for a file read whole");
  };
  if (S_ISDIR(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    ::close(fd);
    throw IoError(path.string() + ": not a regular file (a directory or a device), cannot be read whole");
  }
  if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > max_bytes) too_large();
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      close_and_throw_errno(fd, "cannot read", path);
    }
    if (n == 0) break;
    if (out.size() + size_t(n) > max_bytes) too_large();  // a pipe, or a file that grew
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::filesystem::path& path) {
  const auto* c = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pwrite(fd, c + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write at offset " + std::to_string(offset + done) + " of", path);
    }
    done += static_cast<size_t>(r);
  }
}

void fsync_path(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open for fsync", path);
  if (::fsync(fd) != 0) close_and_throw_errno(fd, "fsync failed on", path);
  ::close(fd);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view data) {
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", tmp);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = saved;
      throw_errno("cannot write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno("cannot fsync", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno("cannot rename into", path);
  }
  std::filesystem::path dir = path.parent_path();
  fsync_path(dir.empty() ? std::filesystem::path(".") : dir);
}

TempDir::TempDir(std::string_view prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/" + std::string(prefix) + ".XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) throw_errno("cannot create temp dir", templ);
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // best effort: a destructor never throws
}

}  // namespace moestream
