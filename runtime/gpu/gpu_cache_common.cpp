// Implementation of runtime/gpu/gpu_cache_common.h.
#include "runtime/gpu/gpu_cache_common.h"

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"

namespace moestream {

bool gpu_event_done(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaSuccess) return true;
  if (r == cudaErrorNotReady) return false;
  MOE_CUDA_CHECK(r);
  return false;
}

uint8_t* gpu_alloc_pinned(size_t bytes, const char* what) {
  uint8_t* p = nullptr;
  if (cudaError_t e = cudaMallocHost(&p, bytes); e != cudaSuccess) {
    cudaGetLastError();
    throw Error("gpu cache: cannot allocate " + gpu_cache_mib(bytes) + " of " + what + ": " +
                cudaGetErrorString(e));
  }
  return p;
}

GpuEventPool::~GpuEventPool() {
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

cudaEvent_t GpuEventPool::take() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e;
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace moestream
