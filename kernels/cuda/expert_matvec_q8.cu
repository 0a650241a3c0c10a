// Expert matvec for q8 rows (loader/format/expert_file.h: per row nb f16 scales, then nb*32 int8 quants):
// one warp per row, lane i takes element i of each 32-wide block, so quant loads coalesce.
// Activations stay float32 (the CPU path quantises them to int8; see docs/gpu.md).
#include <cuda_fp16.h>

#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

// 8 warps (rows) per block: enough resident warps per SM for a 2048-row gate without tiny blocks.
constexpr int kRowsPerBlock = 8;

__global__ void expert_matvec_q8_kernel(const uint8_t* __restrict__ w, int rows, int cols,
                                        const float* __restrict__ x, float* __restrict__ y) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int nb = (cols + 31) / 32;
  const uint8_t* r = w + size_t(row) * nb * 34;
  const auto* qs = reinterpret_cast<const int8_t*>(r + size_t(nb) * 2);
  float acc = 0;
  for (int b = 0; b < nb; ++b) {
    const int c = b * 32 + lane;
    if (c < cols) {
      // Scales sit at 2-byte offsets from a row start that may be odd: assemble from bytes.
      const __half_raw hr{static_cast<unsigned short>(r[2 * b] | (r[2 * b + 1] << 8))};
      acc += __half2float(__half(hr)) * float(qs[c]) * x[c];
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) y[row] = acc;
}

}  // namespace

void expert_matvec_q8_cuda(const uint8_t* w, int rows, int cols, const float* x, float* y,
                           cudaStream_t s) {
  MOE_ASSERT(w && x && y && rows > 0 && cols > 0, "expert_matvec_q8_cuda: bad arguments");
  const unsigned blocks = unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  expert_matvec_q8_kernel<<<blocks, kRowsPerBlock * 32, 0, s>>>(w, rows, cols, x, y);
  MOE_CUDA_CHECK_LAUNCH("expert_matvec_q8_kernel");
}

void expert_matvec_q8(const uint8_t* w, int rows, int cols, const float* x, float* y, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::expert_matvec_q8: bad shape rows=" + std::to_string(rows) +
                " cols=" + std::to_string(cols));
  if (!w || !x || !y) throw Error("gpu::expert_matvec_q8: null device pointer");
  expert_matvec_q8_cuda(w, rows, cols, x, y, s);
}

}  // namespace moestream::gpu
