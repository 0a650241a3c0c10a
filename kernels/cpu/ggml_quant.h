// Arithmetic on weights in ggml's block formats (loader/format/ggml_types.h), computed as stored:
// no f32 copy of a matrix is ever made. Dequantisation (for tests, embeddings and the reference
// path), the matrix-vector product of decode and the small matrix product of prefill/batching.
// AVX2/FMA kernels are chosen at run time; each type has a scalar reference they are tested against.
//
// A matrix is `rows` rows of `cols` elements, row-major, each row ggml_row_bytes(type, cols)
// bytes, back to back (a GGUF tensor of ne = [cols, rows]); cols is a multiple of the block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/format/ggml_types.h"

namespace moestream {

// True when this build can dequantise and multiply type t. Others are refused by the loader with
// an error naming the tensor and the type.
bool ggml_type_computable(GgmlType t);
// Throws ConfigError "<file>: tensor '<tensor>' has type <T>, which this build cannot compute" for a
// type ggml_type_computable refuses (how the loaders and the converter name such a tensor).
void require_ggml_computable(GgmlType t, const std::string& file, const std::string& tensor);

// Decodes n elements (a multiple of the type's block) from src into dst. Bit for bit the
// dequantisation of the `gguf` PyPI package (gguf.quants.dequantize).
void ggml_dequantize_row(GgmlType t, const uint8_t* src, size_t n, float* dst);

// y[r] = W[r] . x for r in [row_begin, row_end). Threads split work by calling this on disjoint
// row ranges; the activation is rounded as the type's kernel needs it (see ggml_kernels.h).
void ggml_matvec(GgmlType t, const uint8_t* w, size_t cols, const float* x, float* y,
                 size_t row_begin, size_t row_end);

// For each of n inputs (x: n x cols, row-major): y[i * y_stride + r] = W[r] . x[i] for r in
// [row_begin, row_end). Equal, input by input, to ggml_matvec (the same rounding and summation).
void ggml_matmul(GgmlType t, const uint8_t* w, size_t cols, const float* x, size_t n, float* y,
                 size_t y_stride, size_t row_begin, size_t row_end);

// Sizes the calling thread's kernel scratch (inputs rounded to int8) for up to max_inputs inputs
// of max_cols columns, so later ggml_matvec/ggml_matmul calls on this thread allocate nothing.
// Call it on every thread that will run them (ThreadPool::on_each_thread); without it the first
// (or a wider) call on each thread allocates.
void ggml_reserve_scratch(size_t max_cols, size_t max_inputs);

}  // namespace moestream
