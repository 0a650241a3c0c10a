// Internal to kernels/: the single-row product (decode) of up to three weight matrices that share
// their width, in one launch, with 16-byte weight loads: the experts' gate and up (and down) at
// one token row per expert, the dense q/k/v projections, o and lm_head at one token.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "loader/format/expert_file.h"

namespace moestream::gpu {

constexpr int kGemvMaxMats = 3;

// One matrix of a launch: dense, `matrix` is it; grouped, group g's is w[g] + offset. y gets
// [token, rows] rows, or has them added (`add`: y + the product, the float an add_inplace of
// the product would give).
struct GemvMat {
  const uint8_t* matrix = nullptr;
  size_t offset = 0;
  int rows = 0;
  const float* x = nullptr;
  float* y = nullptr;
  bool add = false;
};

// Grouped (w and row_start set): group g's token rows [row_start[g], row_start[g+1]) of each
// matrix's x times that group's matrix. Dense (w and row_start null): tokens [0, n_tokens).
// `first` is filled by the launcher (each matrix's first warp-row).
struct GemvArgs {
  GemvMat mat[kGemvMaxMats];
  long long first[kGemvMaxMats + 1] = {};
  int n_mats = 0;
  int cols = 0;
  const uint8_t* const* w = nullptr;
  const int* row_start = nullptr;
  int n_groups = 1;
  int n_tokens = 1;
};

// Whether a row of `cols` in type q is whole 16-byte chunks whose sections start 16-byte
// aligned (q8/q4 packs: cols % 256 == 0, nb % 8 blocks; bf16 (pack or ggml): cols % 8 == 0;
// ggml Q8_0: cols % 256 == 0, eight 34-byte blocks being 17 chunks, and a row's rounded input
// within the CTA's shared memory). Other shapes and types keep the tile-loop GEMM.
bool decode_gemv_fits(QuantType q, int cols);

// Launches the product; asserts decode_gemv_fits, every matrix (dense) or offset (grouped)
// 16-byte aligned, each x 16-byte aligned. Each (matrix, group, row, token) output is the same
// float whatever else the launch computes (a warp per output row, a fixed summation order), so
// splitting groups or matrices over launches changes no bit.
void decode_gemv_cuda(QuantType q, GemvArgs a, cudaStream_t s);

// ggml Q8_0's form (decode_gemv_q8_0.cu): a warp per row as above, the row staged through shared
// memory in 16-byte loads, the input rounded to q8_0 in the CTA and multiplied with __dp4a.
bool decode_gemv_q8_0_fits(int cols);
void decode_gemv_q8_0_cuda(GemvArgs a, cudaStream_t s);

}  // namespace moestream::gpu
