// The CPU expert matvec's int8 activation rounding on the GPU (kernels/cuda/round_activations.h): one
// warp per 32-wide block, lane i owns element i. Reference: kernels/cpu/quant.cpp quantize_activations.
#include <cuda_fp16.h>

#include <algorithm>
#include <optional>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/round_activations.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kWarpsPerBlock = 8;

// x and out may be the same array (each element is read before it is written, by the same lane).
// kSwiglu: the value rounded is silu(x) * up (gate x), swiglu_kernel's expression, so the fused
// launch gives the bits of swiglu then this rounding. idx (may be null): output row r reads input
// row idx[r] (gather_rows then this rounding, in one launch).
template <bool kSwiglu>
__global__ void round_activations_q8_kernel(const float* x, const float* up, const int* idx,
                                            float* out, int rows, int cols, int nb) {
  const long long blk = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (blk >= (long long)rows * nb) return;  // whole warps exit together
  const int lane = threadIdx.x & 31;
  const int r = int(blk / nb), b = int(blk % nb);
  const int c = b * 32 + lane;
  const float* row = x + size_t(idx ? idx[r] : r) * cols;
  float v = 0.0f;  // past the row: the CPU's zero padding
  if (c < cols) {
    const float g = row[c];
    if constexpr (kSwiglu) v = g / (1.0f + expf(-g)) * up[size_t(r) * cols + c];
    else v = g;
  }
  const float amax = warp_max(fabsf(v));
  // IEEE division and rint (ties to even), as std::nearbyint on the CPU: bit-identical rounding.
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  const float d = __fdiv_rn(amax, 127.0f);
  const float q = fminf(fmaxf(rintf(__fmul_rn(v, id)), -127.0f), 127.0f);
  if (c < cols) out[size_t(r) * cols + c] = __fmul_rn(q, d);
}

// One warp per kBlock-wide block (kBlock / 32 elements a lane): the CPU's ggml activation rounding
// (kernels/cpu/ggml_legacy.cpp ggml_round_activations for 32, ggml_kquants.cpp
// kquant_round_activations for 256). cols is a whole number of blocks.
template <int kBlock, bool kF16Scale>
__global__ void round_activations_blocks_kernel(const float* x, float* out, long long n_blocks) {
  constexpr int kPer = kBlock / 32;
  const long long blk = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (blk >= n_blocks) return;
  const int lane = threadIdx.x & 31;
  const float* b = x + blk * kBlock;
  float* o = out + blk * kBlock;
  float v[kPer];
  float a = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    v[j] = b[lane + 32 * j];
    a = fmaxf(a, fabsf(v[j]));  // fmaxf skips a NaN, as the CPU's max does
  }
  const float amax = warp_max(a);
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  float d = __fdiv_rn(amax, 127.0f);
  if (kF16Scale) d = __half2float(__float2half_rn(d));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    // + 0: a rounded -0 becomes +0, as the CPU's int8 zero converts (bit-identical inputs).
    const float q = __fadd_rn(rintf(fminf(fmaxf(__fmul_rn(v[j], id), -127.0f), 127.0f)), 0.0f);
    o[lane + 32 * j] = __fmul_rn(q, d);
  }
}

template <int kBlock, bool kF16Scale>
void round_activations_blocks_cuda(const float* x, float* out, long long n_blocks, cudaStream_t s) {
  const long long blocks = (n_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  MOE_ASSERT(blocks < (1LL << 31), "round_activations_blocks_cuda: grid too large");
  round_activations_blocks_kernel<kBlock, kF16Scale><<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(x, out, n_blocks);
  MOE_CUDA_CHECK_LAUNCH("round_activations_blocks_kernel");
}

// Launcher (file-local: the ops below are its only callers). up non-null: the SwiGLU variant;
// idx non-null: the gathering one.
void round_activations_q8_cuda(const float* x, const float* up, float* out, int rows, int cols,
                               cudaStream_t s, const int* idx = nullptr) {
  MOE_ASSERT(x && out && rows > 0 && cols > 0, "round_activations_q8_cuda: bad arguments");
  const int nb = (cols + 31) / 32;
  const long long warps = (long long)rows * nb;
  const long long blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  MOE_ASSERT(blocks < (1LL << 31), "round_activations_q8_cuda: grid too large");
  if (up)
    round_activations_q8_kernel<true><<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(
        x, up, nullptr, out, rows, cols, nb);
  else
    round_activations_q8_kernel<false><<<unsigned(blocks), kWarpsPerBlock * 32, 0, s>>>(
        x, nullptr, idx, out, rows, cols, nb);
  MOE_CUDA_CHECK_LAUNCH("round_activations_q8_kernel");
}

}  // namespace

void round_activations_q8(float* x, int rows, int cols, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::round_activations_q8: bad shape rows=" + std::to_string(rows) +
                " cols=" + std::to_string(cols));
  if (!x) throw Error("gpu::round_activations_q8: null device pointer");
  round_activations_q8_cuda(x, nullptr, x, rows, cols, s);
}

ActivationRounding activation_rounding(QuantType q) {
  if (q == QuantType::kQ8 || q == QuantType::kQ4) return ActivationRounding::kPackQ8;
  const std::optional<GgmlType> t = quant_ggml_type(q);
  if (!t) return ActivationRounding::kNone;  // f32, bf16: their kernels take float inputs
  switch (*t) {
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1:
    case GgmlType::kQ8_0: case GgmlType::kIQ4_NL: case GgmlType::kMXFP4: case GgmlType::kNVFP4:
      return ActivationRounding::kBlock32F16;
    case GgmlType::kQ2_K: case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: case GgmlType::kIQ4_XS: case GgmlType::kIQ2_XXS: case GgmlType::kIQ2_XS:
    case GgmlType::kIQ2_S: case GgmlType::kIQ3_XXS: case GgmlType::kIQ3_S: case GgmlType::kIQ1_S:
    case GgmlType::kIQ1_M: case GgmlType::kTQ1_0: case GgmlType::kTQ2_0:
      return ActivationRounding::kBlock256;
    default:
      return ActivationRounding::kNone;  // F32, F16, BF16: multiplied as floats on the CPU too
  }
}

bool round_activations(QuantType q, const float* x, float* out, int rows, int cols, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::round_activations: bad shape rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
  if (!x || !out) throw Error("gpu::round_activations: null device pointer");
  const ActivationRounding r = activation_rounding(q);
  if (r == ActivationRounding::kNone) return false;
  if (r == ActivationRounding::kPackQ8) {
    round_activations_q8_cuda(x, nullptr, out, rows, cols, s);
    return true;
  }
  const int block = r == ActivationRounding::kBlock32F16 ? 32 : 256;
  if (cols % block != 0)
    throw ConfigError("gpu::round_activations: " + std::string(quant_name(q)) + " inputs of " + std::to_string(cols) +
                      " columns are not whole " + std::to_string(block) + "-wide blocks");
  const long long n_blocks = (long long)rows * (cols / block);
  if (block == 32) round_activations_blocks_cuda<32, true>(x, out, n_blocks, s);
  else round_activations_blocks_cuda<256, false>(x, out, n_blocks, s);
  return true;
}

void swiglu_rounded(QuantType q, const float* gate, const float* up, int rows, int cols,
                    float* out, Stream s) {
  if (rows <= 0 || cols <= 0)
    throw Error("gpu::swiglu_rounded: bad shape rows=" + std::to_string(rows) +
                " cols=" + std::to_string(cols));
  if (!gate || !up || !out) throw Error("gpu::swiglu_rounded: null device pointer");
  if (activation_rounding(q) == ActivationRounding::kPackQ8) {
    round_activations_q8_cuda(gate, up, out, rows, cols, s);
    return;
  }
  swiglu(gate, up, size_t(rows) * size_t(cols), out, s);
  round_activations(q, out, out, rows, cols, s);
}

bool gather_rounded(QuantType q, const float* src, const int* idx, int n, int cols, float* out,
                    Stream s) {
  if (n <= 0 || cols <= 0)
    throw Error("gpu::gather_rounded: bad shape n=" + std::to_string(n) +
                " cols=" + std::to_string(cols));
  if (!src || !idx || !out) throw Error("gpu::gather_rounded: null device pointer");
  if (activation_rounding(q) != ActivationRounding::kPackQ8) return false;
  round_activations_q8_cuda(src, nullptr, out, n, cols, s, idx);
  return true;
}

}  // namespace moestream::gpu
