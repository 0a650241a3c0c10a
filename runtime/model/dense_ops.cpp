// Implementation of runtime/model/dense_ops.h.
#include "runtime/model/dense_ops.h"

#include <cmath>

#include "common/error.h"

namespace moestream {

namespace {
// 64 output rows of a 2048-wide f32 matrix = 512 KiB per task: large enough to amortise the
// task hand-off, small enough that a 2048-row projection yields 32 tasks to balance.
constexpr Eigen::Index kLinearSlice = 64;
}  // namespace

void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
  Eigen::Map<const Eigen::VectorXf> xv(x, n), wv(w, n);
  Eigen::Map<Eigen::VectorXf> ov(out, n);
  const float inv = 1.0f / std::sqrt(xv.squaredNorm() / static_cast<float>(n) + eps);
  ov = (xv * inv).cwiseProduct(wv);
}

void linear(ThreadPool& pool, const ConstRowMap& x, const RowMatrix& w, RowMap y) {
  MOE_ASSERT(x.cols() == w.cols() && y.cols() == w.rows() && y.rows() == x.rows());
  const Eigen::Index out = w.rows();
  const size_t n_slices = static_cast<size_t>((out + kLinearSlice - 1) / kLinearSlice);
  if (x.rows() == 1) {
    pool.parallel_for(n_slices, [&](size_t s) {
      const Eigen::Index r0 = static_cast<Eigen::Index>(s) * kLinearSlice;
      const Eigen::Index n = std::min(kLinearSlice, out - r0);
      y.row(0).segment(r0, n).transpose().noalias() = w.middleRows(r0, n) * x.row(0).transpose();
    });
  } else {
    pool.parallel_for(n_slices, [&](size_t s) {
      const Eigen::Index r0 = static_cast<Eigen::Index>(s) * kLinearSlice;
      const Eigen::Index n = std::min(kLinearSlice, out - r0);
      y.middleCols(r0, n).noalias() = x * w.middleRows(r0, n).transpose();
    });
  }
}

}  // namespace moestream
