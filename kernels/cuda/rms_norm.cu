// RMSNorm on the GPU: one block per row, float32 sum of squares (HF RMSNorm), then scale by the
// weight. Reference: runtime/model/dense_ops.cpp rms_norm. Also the resident decode step's end of
// a MoE layer: the combine added to the residual, then the next norm, in one launch.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

// 1024 threads: a decode row is latency-bound, and a hidden size of 2048-7168 then takes 2-7
// loads a thread. The fused combine below must use the same count (the same sum order).
constexpr int kThreads = 1024;

// The end both kernels below share, so that their bits agree: the block's sum of the threads'
// shares ss of the squares, then out[i] = x[i] * inv * w[i] over each thread's elements.
__device__ __forceinline__ void write_normed(const float* xr, float ss, int n, float eps, const float* __restrict__ w,
                                             float* __restrict__ out) {
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = xr[i] * inv * w[i];
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, int n,
                                float eps, float* __restrict__ out) {
  const float* xr = x + size_t(blockIdx.x) * n;
  float* orow = out + size_t(blockIdx.x) * n;
  float ss = 0;
  // Unrolled so that a thread's loads are in flight together (a decode row is latency-bound);
  // the sum keeps its order.
#pragma unroll 8
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  write_normed(xr, ss, n, eps, w, orow);
}

// moe_combine_add of one token (kernels/cuda/rows.cu: the sum from zero in j order, then added
// to x) and rms_norm_kernel of the new x in one block: each thread combines the elements whose
// squares it sums, in rms_norm_kernel's order, so x and out are the bits of the two launches.
__global__ void __launch_bounds__(kThreads)
    combine_add_norm_kernel(const float* __restrict__ y, const int* __restrict__ pair_row,
                            const float* __restrict__ weights, int k, int n, float* x,
                            const float* __restrict__ w, float eps, float* __restrict__ out) {
  __shared__ int rows_s[kMaxFusedCombineK];
  __shared__ float wts_s[kMaxFusedCombineK];
  for (int j = threadIdx.x; j < k; j += blockDim.x) rows_s[j] = pair_row[j], wts_s[j] = weights[j];
  __syncthreads();
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    // Eight rows' loads in flight at once; the sum keeps j order.
    float acc = 0.f;
    int j = 0;
    for (; j + 8 <= k; j += 8) {
      float yv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) yv[u] = y[size_t(rows_s[j + u]) * n + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += wts_s[j + u] * yv[u];
    }
    for (; j < k; ++j) acc += wts_s[j] * y[size_t(rows_s[j]) * n + i];
    const float xi = x[i] + acc;
    x[i] = xi;
    ss += xi * xi;
  }
  write_normed(x, ss, n, eps, w, out);
}

}  // namespace

void rms_norm_cuda(const float* x, const float* w, int rows, int n, float eps, float* out,
                   cudaStream_t s) {
  MOE_ASSERT(x && w && out && rows > 0 && n > 0, "rms_norm_cuda: null pointer or empty shape");
  rms_norm_kernel<<<rows, kThreads, 0, s>>>(x, w, n, eps, out);
  MOE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

void moe_combine_add_norm(const float* y, const int* pair_row, const float* weights, int k, int dim,
                          float* x, const float* w, float eps, float* out, Stream s) {
  if (k <= 0 || k > kMaxFusedCombineK || dim <= 0 || !(eps >= 0))
    throw Error("gpu::moe_combine_add_norm: bad shape (k in [1, " + std::to_string(kMaxFusedCombineK) + "]) k=" + std::to_string(k) + " dim=" +
                std::to_string(dim) + " eps=" + std::to_string(eps));
  if (!y || !pair_row || !weights || !x || !w || !out)
    throw Error("gpu::moe_combine_add_norm: null device pointer");
  combine_add_norm_kernel<<<1, kThreads, 0, s>>>(y, pair_row, weights, k, dim, x, w, eps, out);
  MOE_CUDA_CHECK_LAUNCH("combine_add_norm_kernel");
}

void rms_norm(const float* x, const float* w, int rows, int n, float eps, float* out, Stream s) {
  if (rows <= 0 || n <= 0 || !(eps >= 0))
    throw Error("gpu::rms_norm: bad shape rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
                " eps=" + std::to_string(eps));
  if (!x || !w || !out) throw Error("gpu::rms_norm: null device pointer");
  rms_norm_cuda(x, w, rows, n, eps, out, s);
}

}  // namespace moestream::gpu
