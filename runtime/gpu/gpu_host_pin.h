// --gpu-pin-page-cache (docs/gpu.md "Misses straight from the page cache"): the expert store's
// read-only file mappings page-locked for the device (cudaHostRegister, read-only), so the copy
// engine takes a missed expert straight from the page cache's pages: no host copy at all, where
// the staging path copies it once (mapping to pinned staging). Locking keeps every page of those
// files in RAM for the run, so it is for models whose files fit in memory. Internal to
// runtime/gpu (needs the CUDA runtime).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "loader/store/expert_store.h"

namespace moestream {

class GpuPinnedMappings {
 public:
  // Registers every region. ConfigError naming the reason when there are none (O_DIRECT reads),
  // the device cannot register read-only memory, they exceed the memory available, or CUDA
  // refuses one (naming its file); what was registered before is released.
  explicit GpuPinnedMappings(const std::vector<ExpertStore::MappedRegion>& regions);
  ~GpuPinnedMappings();
  GpuPinnedMappings(const GpuPinnedMappings&) = delete;
  GpuPinnedMappings& operator=(const GpuPinnedMappings&) = delete;

  // Whether [p, p + n) lies inside one registered region.
  bool contains(const uint8_t* p, size_t n) const;
  uint64_t bytes() const { return bytes_; }
  double seconds() const { return seconds_; }  // registration time

 private:
  void release() noexcept;
  std::vector<std::pair<const uint8_t*, uint64_t>> regions_;  // registered, sorted by address
  uint64_t bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace moestream
