// Internal to the GPU expert cache (runtime/gpu/gpu_*.cpp; needs the CUDA runtime): the event
// pool its parts share, a non-blocking completion test, pinned host allocation and MiB text.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moestream {

inline constexpr size_t kGpuCacheMiB = size_t{1} << 20;

// Every expert slot (and scratch entry) starts at a multiple of this from its chunk's start:
// the expert kernels need 16-byte aligned weights (gpu_ops.h), whatever a payload's size.
inline constexpr size_t kGpuSlotAlign = 16;
inline size_t gpu_slot_bytes(size_t payload_bytes) {
  return (payload_bytes + kGpuSlotAlign - 1) / kGpuSlotAlign * kGpuSlotAlign;
}

inline std::string gpu_cache_mib(size_t bytes) { return std::to_string(bytes / kGpuCacheMiB) + " MiB"; }

// True when the event completed; false while pending; throws on a device fault.
bool gpu_event_done(cudaEvent_t e);

// `bytes` of pinned host memory; Error "gpu cache: cannot allocate N MiB of <what>: ..." else.
uint8_t* gpu_alloc_pinned(size_t bytes, const char* what);

// Events handed out and taken back by copy batches, kernel groups and predictions alike, so
// a steady state creates none. Host thread only.
class GpuEventPool {
 public:
  GpuEventPool() = default;
  ~GpuEventPool();
  GpuEventPool(const GpuEventPool&) = delete;
  GpuEventPool& operator=(const GpuEventPool&) = delete;

  cudaEvent_t take();
  void give(cudaEvent_t e) { spare_.push_back(e); }
  size_t n_spare() const { return spare_.size(); }

 private:
  std::vector<cudaEvent_t> spare_;
};

}  // namespace moestream
