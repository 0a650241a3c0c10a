// Implementation of runtime/gpu/gpu_host_pin.h.
#include "runtime/gpu/gpu_host_pin.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "common/option_ref.h"
#include "common/memory_room.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"

namespace moestream {

GpuPinnedMappings::GpuPinnedMappings(const std::vector<ExpertStore::MappedRegion>& regions) {
  if (regions.empty())
    throw ConfigError(option_ref("gpu_pin_page_cache") + ": the store maps no file (O_DIRECT reads have no page cache "
                      "to pin); drop " + option_ref("io_direct") + " or " + option_ref("gpu_pin_page_cache"));
  int dev = 0, ro = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev));
  if (!ro)
    throw ConfigError(option_ref("gpu_pin_page_cache") + ": this device cannot register read-only host memory "
                      "(cudaDevAttrHostRegisterReadOnlySupported is 0)");
  uint64_t total = 0;  // what locking adds to memory: files on tmpfs are in it already
  for (const auto& r : regions) total += on_memory_filesystem(r.path) ? 0 : r.size;
  // The room, not MemAvailable alone: locked file pages count against a cgroup's limit too.
  if (const auto room = memory_room(); room && total > room->bytes)
    throw ConfigError(option_ref("gpu_pin_page_cache") + ": the model's files (" + gib_text(total) +
                      ") would stay locked in RAM, more than the " + gib_text(room->bytes) + " this process may fill (" +
                      room->source + "); drop the flag to stream them");
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& r : regions) {
    // Every page is faulted in and locked: the first run over a cold file reads it whole here.
    const cudaError_t e = cudaHostRegister(const_cast<uint8_t*>(r.data), r.size, cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
      cudaGetLastError();
      release();
      throw ConfigError(option_ref("gpu_pin_page_cache") + ": CUDA could not page-lock " + r.path.string() + " (" +
                        gib_text(r.size) + "): " + cudaGetErrorString(e));
    }
    regions_.emplace_back(r.data, r.size);
    bytes_ += r.size;
  }
  seconds_ = seconds_since(t0);
  std::sort(regions_.begin(), regions_.end());
}

GpuPinnedMappings::~GpuPinnedMappings() { release(); }

void GpuPinnedMappings::release() noexcept {
  for (const auto& [p, n] : regions_) cudaHostUnregister(const_cast<uint8_t*>(p));
  regions_.clear();
  cudaGetLastError();
}

bool GpuPinnedMappings::contains(const uint8_t* p, size_t n) const {
  auto it = std::upper_bound(regions_.begin(), regions_.end(), std::make_pair(p, ~uint64_t{0}));
  if (it == regions_.begin()) return false;
  --it;
  return p >= it->first && uint64_t(p - it->first) + n <= it->second;
}

}  // namespace moestream
