// Page-cache residency of byte ranges of a file: how much of each expert is already in host RAM,
// asked of the kernel (cachestat(2), Linux >= 6.5) or, where that is missing, mincore(2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>

namespace moestream {

enum class ResidencyMethod { kAuto, kCachestat, kMincore };
std::string_view residency_method_name(ResidencyMethod m);

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Pages of a range (clipped to the end of the file) and how many of them are in the page cache.
struct RangeResidency {
  uint64_t pages = 0;
  uint64_t resident_pages = 0;
  bool fully_resident() const { return resident_pages == pages; }
  double fraction() const { return pages ? double(resident_pages) / double(pages) : 1.0; }
};

// True when this kernel implements cachestat(2) (probed once).
bool cachestat_supported();

// Queries may come from several threads at once.
class PageCacheResidency {
 public:
  // kAuto picks cachestat where supported, else mincore. Asking for kCachestat where it is
  // missing throws ConfigError. Throws IoError naming the path when it cannot be opened.
  // mincore reports page-cache state of a shared file mapping only to a caller that owns the
  // file or may write it (Linux >= 5.0); otherwise it sees only pages this process touched.
  explicit PageCacheResidency(const std::filesystem::path& path,
                              ResidencyMethod method = ResidencyMethod::kAuto);
  ~PageCacheResidency();
  PageCacheResidency(const PageCacheResidency&) = delete;
  PageCacheResidency& operator=(const PageCacheResidency&) = delete;

  ResidencyMethod method() const;  // the method in use, never kAuto
  RangeResidency query(uint64_t offset, uint64_t length) const;
  void query(std::span<const ByteRange> ranges, std::span<RangeResidency> out) const;

  // A cheap estimate: looks at `n_pages` evenly spaced pages of the range (first and last
  // included) instead of all of them; the result counts only the sampled pages. Exact counting
  // costs ~30 ns per page (a 2.5 MiB expert: ~20 us); experts are read and evicted as a unit,
  // so a few pages tell resident from not. Used per layer per token.
  RangeResidency sample(uint64_t offset, uint64_t length, uint32_t n_pages = 4) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
