// RMSNorm on the GPU: one block per row, float32 sum of squares (HF RMSNorm), then scale by the
// weight. Reference: runtime/model/dense_ops.cpp rms_norm.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

// 256 threads: a hidden size of 2048-7168 gives each thread 8-28 elements, enough to hide latency.
constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, int n,
                                float eps, float* __restrict__ out) {
  const float* xr = x + size_t(blockIdx.x) * n;
  float* orow = out + size_t(blockIdx.x) * n;
  float ss = 0;
  // Unrolled so that a thread's loads are in flight together (a decode row is latency-bound);
  // the sum keeps its order.
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) orow[i] = xr[i] * inv * w[i];
}

}  // namespace

void rms_norm_cuda(const float* x, const float* w, int rows, int n, float eps, float* out,
                   cudaStream_t s) {
  MOE_ASSERT(x && w && out && rows > 0 && n > 0, "rms_norm_cuda: null pointer or empty shape");
  rms_norm_kernel<<<rows, kThreads, 0, s>>>(x, w, n, eps, out);
  MOE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

void rms_norm(const float* x, const float* w, int rows, int n, float eps, float* out, Stream s) {
  if (rows <= 0 || n <= 0 || !(eps >= 0))
    throw Error("gpu::rms_norm: bad shape rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                " eps=" + std::to_string(eps));
  if (!x || !w || !out) throw Error("gpu::rms_norm: null device pointer");
  rms_norm_cuda(x, w, rows, n, eps, out, s);
}

}  // namespace moestream::gpu
