// cachestat(2) and mincore(2) probes behind PageCacheResidency. glibc has no cachestat wrapper
// yet, so it is called by number (451 on every architecture since Linux 6.5).
#include "loader/io/residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/file_util.h"

namespace moestream {
namespace {

#ifdef SYS_cachestat
constexpr long kSysCachestat = SYS_cachestat;
#else
constexpr long kSysCachestat = 451;
#endif

struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

long sys_cachestat(int fd, uint64_t off, uint64_t len, Cachestat* out) {
  CachestatRange r{off, len};
  return ::syscall(kSysCachestat, fd, &r, out, 0);
}

uint64_t page_bytes() {
  static const uint64_t p = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

}  // namespace

std::string_view residency_method_name(ResidencyMethod m) {
  static constexpr EnumName<ResidencyMethod> kNames[] = {{ResidencyMethod::kAuto, "auto"},
                                                         {ResidencyMethod::kCachestat, "cachestat"},
                                                         {ResidencyMethod::kMincore, "mincore"}};
  return enum_name(kNames, m, "?");
}

bool cachestat_supported() {
  static const bool ok = [] {
    int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    Cachestat cs{};
    long rc = sys_cachestat(fd, 0, 4096, &cs);
    int err = errno;
    ::close(fd);
    return rc == 0 || err != ENOSYS;  // EOPNOTSUPP etc. would be file-specific, not missing
  }();
  return ok;
}

struct PageCacheResidency::Impl {
  std::string path;
  int fd = -1;
  ResidencyMethod method = ResidencyMethod::kMincore;
  mutable std::mutex mu;          // guards size and the mapping, which grow with the file
  mutable uint64_t size = 0;      // file size last seen
  mutable uint8_t* map = nullptr; // mincore only
  mutable uint64_t map_bytes = 0;
  mutable std::vector<unsigned char> vec;

  // Re-reads the size when a query reaches past the size last seen (the file may have grown).
  uint64_t size_for(uint64_t end) const {
    if (end > size) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) throw_errno("cannot stat", path);
      size = static_cast<uint64_t>(st.st_size);
    }
    return size;
  }

  RangeResidency query(uint64_t offset, uint64_t length) const {
    std::lock_guard<std::mutex> lock(mu);  // size and the mapping may be refreshed
    RangeResidency r;
    const uint64_t pg = page_bytes();
    uint64_t end = offset + length < offset ? UINT64_MAX : offset + length;
    uint64_t fsize = size_for(end);
    end = std::min(end, fsize);
    if (length == 0 || offset >= end) return r;
    uint64_t first = offset / pg;
    uint64_t last = (end + pg - 1) / pg;  // exclusive
    r.pages = last - first;
    if (method == ResidencyMethod::kCachestat) {
      Cachestat cs{};
      if (sys_cachestat(fd, first * pg, r.pages * pg, &cs) != 0)
        throw IoError("cachestat failed on " + path + " at offset " + std::to_string(offset) +
                      " length " + std::to_string(length) + ": " + std::strerror(errno));
      r.resident_pages = std::min(cs.nr_cache, r.pages);
      return r;
    }
    if (last * pg > map_bytes) remap(fsize);
    if (vec.size() < r.pages) vec.resize(r.pages);
    if (::mincore(map + first * pg, r.pages * pg, vec.data()) != 0)
      throw IoError("mincore failed on " + path + " at offset " + std::to_string(offset) +
                    " length " + std::to_string(length) + ": " + std::strerror(errno));
    for (uint64_t i = 0; i < r.pages; ++i) r.resident_pages += vec[i] & 1;
    return r;
  }

  void remap(uint64_t fsize) const {
    if (map) ::munmap(map, map_bytes);
    map = nullptr;
    map_bytes = 0;
    void* p = ::mmap(nullptr, fsize, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw_errno("cannot mmap for mincore", path);
    map = static_cast<uint8_t*>(p);
    map_bytes = (fsize + page_bytes() - 1) / page_bytes() * page_bytes();
  }
};

PageCacheResidency::PageCacheResidency(const std::filesystem::path& path, ResidencyMethod method)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path.string();
  if (method == ResidencyMethod::kCachestat && !cachestat_supported())
    throw ConfigError("cachestat(2) is not available on this kernel (Linux >= 6.5 needed)");
  impl_->method = method == ResidencyMethod::kAuto
                      ? (cachestat_supported() ? ResidencyMethod::kCachestat
                                               : ResidencyMethod::kMincore)
                      : method;
  impl_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl_->fd < 0) throw_errno("cannot open", path);
  impl_->size_for(UINT64_MAX);
}

PageCacheResidency::~PageCacheResidency() {
  if (impl_->map) ::munmap(impl_->map, impl_->map_bytes);
  if (impl_->fd >= 0) ::close(impl_->fd);
}

ResidencyMethod PageCacheResidency::method() const { return impl_->method; }

RangeResidency PageCacheResidency::sample(uint64_t offset, uint64_t length, uint32_t n_pages) const {
  const uint64_t pg = page_bytes();
  uint64_t end = offset + length < offset ? UINT64_MAX : offset + length;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    end = std::min(end, impl_->size_for(end));
  }
  RangeResidency r;
  if (length == 0 || offset >= end) return r;
  uint64_t first = offset / pg, last = (end - 1) / pg;  // inclusive page indices
  uint64_t span = last - first + 1;
  if (n_pages == 0 || n_pages >= span) return impl_->query(offset, length);
  uint64_t prev = UINT64_MAX;
  for (uint32_t i = 0; i < n_pages; ++i) {
    uint64_t page = first + (n_pages == 1 ? 0 : (span - 1) * i / (n_pages - 1));
    if (page == prev) continue;
    prev = page;
    RangeResidency one = impl_->query(page * pg, pg);
    r.pages += one.pages;
    r.resident_pages += one.resident_pages;
  }
  return r;
}

RangeResidency PageCacheResidency::query(uint64_t offset, uint64_t length) const {
  return impl_->query(offset, length);
}

void PageCacheResidency::query(std::span<const ByteRange> ranges,
                               std::span<RangeResidency> out) const {
  MOE_ASSERT(out.size() >= ranges.size(), "residency output span too small");
  for (size_t i = 0; i < ranges.size(); ++i) out[i] = impl_->query(ranges[i].offset, ranges[i].length);
}

}  // namespace moestream
