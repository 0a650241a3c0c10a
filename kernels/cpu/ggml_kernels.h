// Internal to kernels/cpu/ggml_*.cpp and their tests: each ggml type's kernels as a table entry.
// Two families fill the table: ggml_legacy.cpp (plain types, the 32-element block types, IQ4_NL,
// MXFP4, and NVFP4 from ggml_nvfp4.cpp) and ggml_kquants.cpp (the 256-element super-block types Q2_K..Q6_K, IQ4_XS, and with
// ggml_iquants.cpp's decoders IQ1_S..IQ3_S, TQ1_0, TQ2_0), each with its AVX2 file(s).
// ggml_quant.cpp dispatches and picks the AVX2 entry when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/format/ggml_types.h"

namespace moestream::detail {

using GgmlDequantizeFn = void (*)(const uint8_t* src, size_t n, float* dst);
using GgmlMatvecFn = void (*)(const uint8_t* w, size_t cols, const float* x, float* y,
                              size_t row_begin, size_t row_end);
using GgmlMatmulFn = void (*)(const uint8_t* w, size_t cols, const float* x, size_t n, float* y,
                              size_t y_stride, size_t row_begin, size_t row_end);

struct GgmlActivations;  // ggml_legacy_kernels.h
// y[r] = W[r] . input `input` of `a` (inputs rounded once, shared by threads and matrices) for r in
// [row_begin, row_end); the 32-element block types and NVFP4 only. Equal bit for bit to the matvec of the
// same type on the float input that `a` was rounded from.
using GgmlRoundedMatvecFn = void (*)(const uint8_t* w, const GgmlActivations& a, size_t input, float* y,
                                     size_t row_begin, size_t row_end);

struct GgmlKernels {
  GgmlDequantizeFn dequantize = nullptr;  // scalar, the bit-exact reference
  GgmlMatvecFn matvec_scalar = nullptr;   // the reference product
  GgmlMatmulFn matmul_scalar = nullptr;
  GgmlMatvecFn matvec_avx2 = nullptr;     // null when the type has no AVX2 kernel (yet)
  GgmlMatmulFn matmul_avx2 = nullptr;
  GgmlRoundedMatvecFn rounded_matvec_scalar = nullptr;  // the block types of the legacy family
  GgmlRoundedMatvecFn rounded_matvec_avx2 = nullptr;
};

// The kernels of t, or null when the family does not compute it.
const GgmlKernels* ggml_legacy_kernels(GgmlType t);
const GgmlKernels* ggml_kquant_kernels(GgmlType t);

// Sizes the calling thread's scratch of the legacy family (its int8-rounded inputs) for up to
// max_inputs inputs of max_cols columns.
void ggml_legacy_reserve_scratch(size_t max_cols, size_t max_inputs);
// Sizes the calling thread's scratch of the kquant family (see ggml_reserve_scratch).
void ggml_kquant_reserve_scratch(size_t max_cols, size_t max_inputs);

}  // namespace moestream::detail
