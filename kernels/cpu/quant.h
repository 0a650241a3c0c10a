// Arithmetic on expert matrices in the encodings of loader/format/expert_file.h: quantise, dequantise,
// and the matrix-vector product the decode step spends its time in (AVX2/FMA with a scalar
// fallback chosen at run time).
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/format/expert_file.h"

namespace moestream {

// Encodes a row-major R x C float matrix into `dst` (quant_matrix_bytes(q, R, C) bytes).
void quantize_matrix(QuantType q, const float* src, size_t rows, size_t cols, uint8_t* dst);

// Decodes an encoded R x C matrix back to float (exact for f32, exact widening for bf16).
void dequantize_matrix(QuantType q, const uint8_t* src, size_t rows, size_t cols, float* dst);

// y[r] = sum_c W[r][c] * x[c] for r in [row_begin, row_end), W encoded in quant type q with
// `cols` columns. Threads split work by calling this on disjoint row ranges.
void quant_matvec(QuantType q, const uint8_t* w, size_t cols, const float* x, float* y,
                  size_t row_begin, size_t row_end);

// Sizes the calling thread's quant_matvec scratch (the int8-rounded input) for inputs of up to
// max_cols columns, so later calls on this thread allocate nothing. Call it on every thread that
// will run quant_matvec (ThreadPool::on_each_thread); without it the first call on each thread
// allocates.
void reserve_matvec_scratch(size_t max_cols);

// True when the AVX2/FMA kernels are in use (the CPU has them and they were compiled in).
bool quant_simd_available();

}  // namespace moestream
