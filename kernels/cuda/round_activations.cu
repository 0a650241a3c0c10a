// The CPU expert matvec's int8 activation rounding on the GPU (kernels/cuda/round_activations.h): one
// warp per 32-wide block, lane i owns element i. Reference: kernels/cpu/quant.cpp quantize_activations.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/round_activations.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void round_activations_q8_kernel(float* __restrict__ x, int rows, int cols, int nb) {
  const long long blk = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (blk >= (long long)rows * nb) return;  // whole warps exit together
  const int lane = threadIdx.x & 31;
  const int r = int(blk / nb), b = int(blk % nb);
  const int c = b * 32 + lane;
  float* row = x + size_t(r) * cols;
  const float v = c < cols ? row[c] : 0.0f;  // past the row: the CPU's zero padding
  const float amax = warp_max(fabsf(v));
  // IEEE division and rint (ties to even), as std::nearbyint on the CPU: bit-identical rounding.
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  const float d = __fdiv_rn(amax, 127.0f);
  const float q = fminf(fmaxf(rintf(__fmul_rn(v, id)), -127.0f), 127.0f);
  if (c < cols) row[c] = __fmul_rn(q, d);
}

// Launcher (file-local: the op below is its only caller).
void round_activations_q8_cuda(float* x, int rows, int cols, cudaStream_t s) {
  MOE_ASSERT(x && rows > 0 && cols > 0, "round_activations_q8_cuda: bad arguments");
  const int nb = (cols + 31) / 32;
  const long long warps = (long long)rows * nb;
  const long long blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  MOE_ASSERT(blocks < (1LL << 31), "round_activations_q8_cuda: grid too large");
  round_activations_q8_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(x, rows, cols, nb);
  MOE_CUDA_CHECK_LAUNCH("round_activations_q8_kernel");
}

}  // namespace

void round_activations_q8(float* x, int rows, int cols, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::round_activations_q8: bad shape rows=" + std::to_string(rows) +
                " cols=" + std::to_string(cols));
  if (!x) throw Error("gpu::round_activations_q8: null device pointer");
  round_activations_q8_cuda(x, rows, cols, s);
}

}  // namespace moestream::gpu
