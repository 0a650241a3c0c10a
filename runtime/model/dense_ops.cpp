// Implementation of runtime/model/dense_ops.h.
#include "runtime/model/dense_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/matvec_input.h"
#include "kernels/cpu/quant.h"

namespace moestream {

namespace {
// 64 output rows of a 2048-wide f32 matrix = 512 KiB per task: large enough to amortise the
// task hand-off, small enough that a 2048-row projection yields 32 tasks to balance.
constexpr Eigen::Index kLinearSlice = 64;
// A typed matrix's slice: ~128 KiB of weights, a multiple of the kernels' 4-row tile, 16 to 4096
// rows. For 2048-wide Q8_0 that is 60 rows, about the task count of the f32 slices (a 512-row
// K/V projection still yields 9 tasks to balance).
constexpr size_t kTypedSliceBytes = 128 * 1024;
size_t typed_slice_rows(size_t row_bytes) {
  const size_t r = row_bytes == 0 ? 4096 : kTypedSliceBytes / row_bytes;
  return std::clamp<size_t>(r - r % 4, 16, 4096);
}

// One vector of a decode step rounded for the stored-type products, by the thread that calls
// linear() (the forward pass's): the pool's threads read it while that thread waits. Grows to the
// widest input once; a warm step allocates nothing.
MatvecInput& step_input() {
  thread_local MatvecInput in;
  return in;
}
}  // namespace

void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
  Eigen::Map<const Eigen::VectorXf> xv(x, n), wv(w, n);
  Eigen::Map<Eigen::VectorXf> ov(out, n);
  const float inv = 1.0f / std::sqrt(xv.squaredNorm() / static_cast<float>(n) + eps);
  ov = (xv * inv).cwiseProduct(wv);
}

namespace {
// W (a RowMatrix, or a map of a stored f32 matrix) times x through Eigen, in fixed row slices.
template <class M>
void linear_f32(ThreadPool& pool, const ConstRowMap& x, const M& w, RowMap& y) {
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
// linear_f32 per range of `splits`, each slice of W applied to every range while it is in cache:
// a one-row range through the gemv linear_f32 runs for one row, a longer one through its gemm.
template <class M>
void linear_f32_ranges(ThreadPool& pool, const ConstRowMap& x, const M& w, RowMap& y, std::span<const int> splits) {
  MOE_ASSERT(x.cols() == w.cols() && y.cols() == w.rows() && y.rows() == x.rows());
  MOE_ASSERT(splits.size() >= 2 && splits.front() == 0 && splits.back() == x.rows(), "bad batch row splits");
  const Eigen::Index out = w.rows();
  const size_t n_slices = static_cast<size_t>((out + kLinearSlice - 1) / kLinearSlice);
  pool.parallel_for(n_slices, [&](size_t s) {
    const Eigen::Index r0 = static_cast<Eigen::Index>(s) * kLinearSlice;
    const Eigen::Index n = std::min(kLinearSlice, out - r0);
    const auto ws = w.middleRows(r0, n);
    for (size_t i = 0; i + 1 < splits.size(); ++i) {
      const Eigen::Index t0 = splits[i], rows = splits[i + 1] - t0;
      MOE_ASSERT(rows > 0, "empty batch row range");
      if (rows == 1)
        y.row(t0).segment(r0, n).transpose().noalias() = ws * x.row(t0).transpose();
      else
        y.block(t0, r0, rows, n).noalias() = x.middleRows(t0, rows) * ws.transpose();
    }
  });
}
}  // namespace

void linear(ThreadPool& pool, const ConstRowMap& x, const RowMatrix& w, RowMap y) { linear_f32(pool, x, w, y); }

void linear_ranges(ThreadPool& pool, const ConstRowMap& x, const RowMatrix& w, RowMap y,
                   std::span<const int> splits) {
  if (splits.size() <= 2) return linear_f32(pool, x, w, y);
  linear_f32_ranges(pool, x, w, y, splits);
}

void linear_ranges(ThreadPool& pool, const ConstRowMap& x, const DenseMatrix& w, RowMap y,
                   std::span<const int> splits) {
  // A stored type: linear() over all rows already is row by row (ggml_matmul equals ggml_matvec,
  // which is quant_matvec for these types, input by input).
  if (splits.size() <= 2 || w.type != QuantType::kF32) return linear(pool, x, w, y);
  const ConstRowMap m(reinterpret_cast<const float*>(w.data), Eigen::Index(w.rows), Eigen::Index(w.cols));
  linear_f32_ranges(pool, x, m, y, splits);
}

void linear_group_ranges(ThreadPool& pool, const ConstRowMap& x, std::span<const DenseMatrix* const> ws,
                         std::span<RowMap* const> ys, std::span<const int> splits) {
  if (splits.size() <= 2) return linear_group(pool, x, ws, ys);
  for (size_t m = 0; m < ws.size(); ++m) linear_ranges(pool, x, *ws[m], *ys[m], splits);
}

void swiglu(RowMap gate, const float* up) {
  const ConstRowMap u(up, gate.rows(), gate.cols());
  gate.array() = gate.array() / (1.0f + (-gate.array()).exp()) * u.array();
}

void swiglu_ranges(RowMap gate, const float* up, std::span<const int> splits, RowMatrix& scratch) {
  if (splits.size() <= 2) return swiglu(gate, up);
  const Eigen::Index cols = gate.cols();
  for (size_t i = 0; i + 1 < splits.size(); ++i) {
    const Eigen::Index r0 = splits[i], n = splits[i + 1] - r0;
    float* g = gate.row(r0).data();
    const float* u = up + size_t(r0) * size_t(cols);  // loads give the same values anywhere
    if (reinterpret_cast<uintptr_t>(g) % EIGEN_DEFAULT_ALIGN_BYTES == 0) {
      swiglu(RowMap(g, n, cols), u);
      continue;
    }
    MOE_ASSERT(scratch.rows() >= n && scratch.cols() >= cols, "swiglu scratch too small");
    RowMap s(scratch.data(), n, cols);  // a matrix's storage starts aligned, as the run alone's
    s = RowMap(g, n, cols);
    swiglu(s, u);
    RowMap(g, n, cols) = s;
  }
}

void linear(ThreadPool& pool, const ConstRowMap& x, const DenseMatrix& w, RowMap y) {
  const DenseMatrix* ws[1] = {&w};
  RowMap* ys[1] = {&y};
  linear_group(pool, x, ws, ys);
}

void linear_group(ThreadPool& pool, const ConstRowMap& x, std::span<const DenseMatrix* const> ws,
                  std::span<RowMap* const> ys) {
  MOE_ASSERT(ws.size() == ys.size() && !ws.empty() && ws.size() <= 8, "linear_group of 1..8 matrices");
  const size_t T = size_t(x.rows());
  bool one_kind = true;  // every matrix takes the same rounded input: one parallel section for all
  for (size_t m = 0; m < ws.size(); ++m) {
    const DenseMatrix& w = *ws[m];
    MOE_ASSERT(size_t(x.cols()) == w.cols && size_t(ys[m]->cols()) == w.rows && ys[m]->rows() == x.rows());
    one_kind = one_kind && w.type != QuantType::kF32 && matvec_input_kind(w.type) == matvec_input_kind(ws[0]->type);
  }
  if (T != 1 || !one_kind) {  // f32 through Eigen, several rows through ggml_matmul: one by one
    for (size_t m = 0; m < ws.size(); ++m) {
      const DenseMatrix& w = *ws[m];
      RowMap& y = *ys[m];
      if (w.type == QuantType::kF32) {  // Eigen, as for f32 before: f32 packs and GGUFs give the same numbers
        const ConstRowMap f(reinterpret_cast<const float*>(w.data), Eigen::Index(w.rows), Eigen::Index(w.cols));
        linear_f32(pool, x, f, y);
        continue;
      }
      if (T == 1) {  // a typed matrix among others that round differently: alone below
        linear_group(pool, x, ws.subspan(m, 1), ys.subspan(m, 1));
        continue;
      }
      const std::optional<GgmlType> g = quant_ggml_type(w.type);
      MOE_ASSERT(g.has_value(), "dense matrices are f32 or a ggml type");
      const size_t slice = typed_slice_rows(w.row_bytes());
      pool.parallel_for((w.rows + slice - 1) / slice, [&](size_t s) {
        const size_t r0 = s * slice, r1 = std::min(w.rows, r0 + slice);
        ggml_matmul(*g, w.data, w.cols, x.data(), T, y.data(), size_t(y.cols()), r0, r1);
      });
    }
    return;
  }
  // Decode: x rounded once, then the row slices of every matrix in one parallel section (a
  // layer's q, k and v: one hand-off and one wait instead of three, and the small k/v slices
  // fill in beside q's). Each slice is the one linear() computes for its matrix alone.
  MatvecInput& in = step_input();
  in.round(ws[0]->type, x.data(), ws[0]->cols);
  size_t first[9] = {0}, slice[8];
  for (size_t m = 0; m < ws.size(); ++m) {
    slice[m] = typed_slice_rows(ws[m]->row_bytes());
    first[m + 1] = first[m] + (ws[m]->rows + slice[m] - 1) / slice[m];
  }
  pool.parallel_for(first[ws.size()], [&](size_t s) {
    size_t m = 0;
    while (s >= first[m + 1]) ++m;
    const DenseMatrix& w = *ws[m];
    const size_t r0 = (s - first[m]) * slice[m];
    quant_matvec(w.type, w.data, w.cols, in, ys[m]->data(), r0, std::min(w.rows, r0 + slice[m]));
  });
}

}  // namespace moestream
