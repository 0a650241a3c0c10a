// Expert matvec for bf16 rows (loader/format/expert_file.h: R*C bfloat16, the upper half of a float32):
// one warp per row, lanes stride the row so loads coalesce.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kRowsPerBlock = 8;  // as expert_matvec_q8.cu

__global__ void expert_matvec_bf16_kernel(const uint16_t* __restrict__ w, int rows, int cols,
                                          const float* __restrict__ x, float* __restrict__ y) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const uint16_t* r = w + size_t(row) * cols;
  float acc = 0;
  for (int c = lane; c < cols; c += 32) acc += __uint_as_float(uint32_t(r[c]) << 16) * x[c];
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

}  // namespace

void expert_matvec_bf16_cuda(const uint8_t* w, int rows, int cols, const float* x, float* y,
                             cudaStream_t s) {
  MOE_ASSERT(w && x && y && rows > 0 && cols > 0, "expert_matvec_bf16_cuda: bad arguments");
  MOE_ASSERT(reinterpret_cast<uintptr_t>(w) % 2 == 0, "expert_matvec_bf16_cuda: w not 2-aligned");
  const unsigned blocks = unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  expert_matvec_bf16_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(
      reinterpret_cast<const uint16_t*>(w), rows, cols, x, y);
  MOE_CUDA_CHECK_LAUNCH("expert_matvec_bf16_kernel");
}

void expert_matvec_bf16(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::expert_matvec_bf16: bad shape rows=" + std::to_string(rows) +
                " cols=" + std::to_string(cols));
  if (!w || !x || !y) throw Error("gpu::expert_matvec_bf16: null device pointer");
  if (reinterpret_cast<uintptr_t>(w) % 2 != 0)
    throw Error("gpu::expert_matvec_bf16: weights not 2-byte aligned");
  expert_matvec_bf16_cuda(w, rows, cols, x, y, s);
}

}  // namespace moestream::gpu
