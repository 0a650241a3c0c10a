// CUDA graphs of the resident decode step (issue 19 item 2; docs/gpu.md "Resident decode"): the
// step's kernels are captured per segment (one per layer, one for lm_head) and launched as one
// graph each, so the GPU runs a layer's ~20 kernels back to back instead of waiting on each
// launch, and the host captures segment i+1 while the GPU runs segment i. Every step captures
// again (positions and attention splits move with the context) and updates the segment's
// executable graph in place; only a change of shape (a kernel added or removed, e.g. attention
// starting to split the context) instantiates it anew. Internal to runtime/gpu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/gpu/gpu_forward.h"  // GpuGraphStats

namespace moestream {

class GpuGraphSegments {
 public:
  GpuGraphSegments() = default;
  ~GpuGraphSegments();
  GpuGraphSegments(const GpuGraphSegments&) = delete;
  GpuGraphSegments& operator=(const GpuGraphSegments&) = delete;

  // Captures what `enqueue` puts on `stream` (which must not be capturing) as segment `i`,
  // brings the segment's executable graph up to date and launches it on `stream`. What enqueue
  // does must be capturable: kernels, cuBLAS, copies between device and pinned memory, no host
  // synchronisation. An exception from enqueue, or a capture CUDA refuses (Error naming the
  // reason), leaves the stream out of capture and nothing of the segment run. Counts into `st`.
  void run(size_t i, cudaStream_t stream, const std::function<void()>& enqueue, GpuGraphStats& st);

 private:
  std::vector<cudaGraphExec_t> execs_;  // per segment, null until first instantiated
};

}  // namespace moestream
