// The dense building blocks of the CPU forward pass: RMSNorm and a linear layer whose output
// rows are split over the thread pool (Eigen computes each f32 slice, the ggml kernels every
// other stored type).
#pragma once

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
// Allocates nothing once the pool's threads ran ggml_reserve_scratch for x's width and rows.
void linear(ThreadPool& pool, const ConstRowMap& x, const DenseMatrix& w, RowMap y);

}  // namespace moestream
