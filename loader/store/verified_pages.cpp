// Implementation of loader/store/verified_pages.h.
#include "loader/store/verified_pages.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace moestream {

VerifiedPages::~VerifiedPages() {
  for (Layer& l : layers_)
    if (l.fd >= 0) ::close(l.fd);
}

bool VerifiedPages::stat_fd(int fd, Stamp* out) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return false;
  out->dev = st.st_dev;
  out->ino = st.st_ino;
  out->size = st.st_size;
  out->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  out->ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  return true;
}

int VerifiedPages::add_layer(const std::filesystem::path& path, uint32_t n_slots) {
  Layer l;
  l.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (l.fd < 0) throw IoError("cannot open " + path.string() + ": " + std::strerror(errno));
  if (!stat_fd(l.fd, &l.stamp)) {
    const int e = errno;
    ::close(l.fd);
    throw IoError("cannot stat " + path.string() + ": " + std::strerror(e));
  }
  l.marks.assign(n_slots, 0);
  layers_.push_back(std::move(l));
  return int(layers_.size()) - 1;
}

bool VerifiedPages::refresh(int layer) {
  Layer& l = layers_[size_t(layer)];
  Stamp now;
  const bool ok = stat_fd(l.fd, &now);
  if (ok && now == l.stamp) return true;
  // Changed (or unknown): nothing marked so far can be trusted.
  if (std::find(l.marks.begin(), l.marks.end(), 1) != l.marks.end()) ++invalidations_;
  ++l.epoch;
  std::fill(l.marks.begin(), l.marks.end(), 0);
  if (ok) l.stamp = now;
  return ok;
}

}  // namespace moestream
