// Rotary position embedding on the GPU in the rotate_half (neox) layout that runtime/model/rope.cpp
// Rope::apply uses; the cos/sin tables come from Rope::fill, so every scaling type matches.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 256;

// One thread per (token, head, i < half_dim) pair.
// head_stride: floats per head (2*half_dim, or head_dim under GLM's partial rotary, whose tail
// dims pass unrotated).
__global__ void rope_neox_kernel(float* __restrict__ x, int n_tokens, int n_heads, int half_dim, int head_stride,
                                 const float* __restrict__ cos, const float* __restrict__ sin) {
  const size_t total = size_t(n_tokens) * n_heads * half_dim;
  for (size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += size_t(gridDim.x) * blockDim.x) {
    const int i = int(k % half_dim);
    const size_t th = k / half_dim;  // token * n_heads + head
    const size_t t = th / n_heads;
    float* v = x + th * head_stride;
    const float c = cos[t * half_dim + i], sn = sin[t * half_dim + i];
    const float a = v[i], b = v[i + half_dim];
    v[i] = a * c - b * sn;
    v[i + half_dim] = b * c + a * sn;
  }
}

}  // namespace

void rope_neox_cuda(float* x, int n_tokens, int n_heads, int half_dim, const float* cos,
                    const float* sin, cudaStream_t s) {
  MOE_ASSERT(x && cos && sin && n_tokens > 0 && n_heads > 0 && half_dim > 0,
             "rope_neox_cuda: null pointer or empty shape");
  const size_t total = size_t(n_tokens) * n_heads * half_dim;
  // Grid-stride loop: cap the grid so huge prefills do not overflow gridDim.x.
  const unsigned blocks = unsigned(std::min<size_t>((total + kThreads - 1) / kThreads, 65535));
  rope_neox_kernel<<<blocks, kThreads, 0, s>>>(x, n_tokens, n_heads, half_dim, 2 * half_dim, cos, sin);
  MOE_CUDA_CHECK_LAUNCH("rope_neox_kernel");
}

void rope_neox_partial_cuda(float* x, int n_tokens, int n_heads, int half_dim, int head_dim, const float* cos,
                            const float* sin, cudaStream_t s) {
  MOE_ASSERT(x && cos && sin && n_tokens > 0 && n_heads > 0 && half_dim > 0 && 2 * half_dim <= head_dim,
             "rope_neox_partial_cuda: null pointer, empty shape or rotary width over head_dim");
  const size_t total = size_t(n_tokens) * n_heads * half_dim;
  const unsigned blocks = unsigned(std::min<size_t>((total + kThreads - 1) / kThreads, 65535));
  rope_neox_kernel<<<blocks, kThreads, 0, s>>>(x, n_tokens, n_heads, half_dim, head_dim, cos, sin);
  MOE_CUDA_CHECK_LAUNCH("rope_neox_kernel (partial)");
}

void rope_neox(float* x, int n_tokens, int n_heads, int half_dim, const float* cos,
               const float* sin, Stream s) {
  if (n_tokens <= 0 || n_heads <= 0 || half_dim <= 0)
    throw Error("gpu::rope_neox: bad shape n_tokens=" + std::to_string(n_tokens) +
                " n_heads=" + std::to_string(n_heads) + " half_dim=" + std::to_string(half_dim));
  if (!x || !cos || !sin) throw Error("gpu::rope_neox: null device pointer");
  rope_neox_cuda(x, n_tokens, n_heads, half_dim, cos, sin, s);
}

void rope_neox_partial(float* x, int n_tokens, int n_heads, int half_dim, int head_dim, const float* cos,
                       const float* sin, Stream s) {
  if (n_tokens <= 0 || n_heads <= 0 || half_dim <= 0 || 2 * half_dim > head_dim)
    throw Error("gpu::rope_neox_partial: bad shape n_tokens=" + std::to_string(n_tokens) + " n_heads=" +
                std::to_string(n_heads) + " half_dim=" + std::to_string(half_dim) + " head_dim=" +
                std::to_string(head_dim));
  if (!x || !cos || !sin) throw Error("gpu::rope_neox_partial: null device pointer");
  rope_neox_partial_cuda(x, n_tokens, n_heads, half_dim, head_dim, cos, sin, s);
}

}  // namespace moestream::gpu
