// The dense building blocks of the CPU forward pass: RMSNorm and a linear layer whose output
// rows are split over the thread pool (Eigen computes each slice).
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

}  // namespace moestream
