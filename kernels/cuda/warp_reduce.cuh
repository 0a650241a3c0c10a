// Internal to kernels/: warp max, warp and block sum reductions in float32 (fixed shuffle order, so a
// kernel's result does not depend on scheduling).
#pragma once

#include <cuda_runtime.h>

namespace moestream::gpu {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the total. blockDim.x must be a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x >> 5;
  v = lane < n_warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

}  // namespace moestream::gpu
