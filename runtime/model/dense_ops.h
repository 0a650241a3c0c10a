// The dense building blocks of the CPU forward pass: RMSNorm and a linear layer whose output
// rows are split over the thread pool (Eigen computes each f32 slice, the ggml kernels every
// other stored type).
#pragma once

#include <span>

#include "runtime/model/dense_weights.h"
#include "common/thread_pool.h"

namespace moestream {

// Rows of activations: n_rows x cols, row-major, in a caller-owned buffer.
using RowMap = Eigen::Map<RowMatrix>;
using ConstRowMap = Eigen::Map<const RowMatrix>;

// out = x / sqrt(mean(x^2) + eps) * w over one vector of n floats (HF RMSNorm, float32).
void rms_norm(const float* x, const float* w, int n, float eps, float* out);

// y[t] = W x[t] for the first x.rows() rows: y (T x out) = x (T x in) * W^T. W is [out, in].
// Output columns are computed in fixed slices, so results do not depend on the thread count.
void linear(ThreadPool& pool, const ConstRowMap& x, const RowMatrix& w, RowMap y);

// The same from a matrix in its stored type: f32 through Eigen as above; other types through
// the ggml kernels (quant_matvec for one row of x, ggml_matmul for several), which round x as the
// type's kernel needs (int8 blocks for the quantised types; bf16/f16 multiply float x as is).
// One row of x is rounded once by the calling thread (kernels/cpu/matvec_input.h) and shared by
// the pool's threads. Allocates nothing once the pool's threads ran ggml_reserve_scratch for x's
// width and rows and the calling thread has run a product as wide.
void linear(ThreadPool& pool, const ConstRowMap& x, const DenseMatrix& w, RowMap y);

// ys[m] = x W[m]^T for several matrices of one input, each result as linear() gives it. With one
// row of x and matrices whose inputs round alike (a layer's q, k and v), x is rounded once and
// every matrix's row slices run in one parallel section; otherwise linear() per matrix.
void linear_group(ThreadPool& pool, const ConstRowMap& x, std::span<const DenseMatrix* const> ws,
                  std::span<RowMap* const> ys);

// Batches of sequences (runtime/model/cpu_forward.cpp): the same over the rows of several sequences
// at once, `splits` their row boundaries (0 first, x.rows() last), each range's rows getting the
// bits linear() gives that range alone, while W is read once for all of them. A stored type's
// kernel computes each input row on its own (ggml_matmul equals ggml_matvec input by input), so
// one call covers every row. Eigen's f32 product sums a single row (gemv) and several (gemm)
// differently, so each slice of W is applied to every range in turn as linear() would apply it
// to that range, while the slice is in cache. Empty splits: one range.
void linear_ranges(ThreadPool& pool, const ConstRowMap& x, const DenseMatrix& w, RowMap y,
                   std::span<const int> splits);
void linear_ranges(ThreadPool& pool, const ConstRowMap& x, const RowMatrix& w, RowMap y,
                   std::span<const int> splits);
// linear_group over the ranges of `splits`: one range (or none) is linear_group, several are
// linear_ranges per matrix; either way each range gets the bits linear() gives it alone.
void linear_group_ranges(ThreadPool& pool, const ConstRowMap& x, std::span<const DenseMatrix* const> ws,
                         std::span<RowMap* const> ys, std::span<const int> splits);

// SwiGLU's activation in place: gate = silu(gate) * up over a block of rows (`up` alike,
// contiguous), as one Eigen expression (a vectorised exp from the block's first aligned element
// on, scalar ones around).
void swiglu(RowMap gate, const float* up);
// Batches: the same per range of `splits`, each range evaluated from an aligned start as its
// sequence alone evaluates it (which elements take the vectorised exp follows the address: a
// range that does not start aligned is computed in `scratch`, at least [rows, cols]).
void swiglu_ranges(RowMap gate, const float* up, std::span<const int> splits, RowMatrix& scratch);

}  // namespace moestream
