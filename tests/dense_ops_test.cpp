// runtime/model/dense_ops.h: linear_group gives every matrix the bits its own product gives
// (quant_matvec per row of x for the stored types, whose input it rounds once and shares; Eigen for
// f32) whether the group is fused into one parallel section (one row, one input kind) or not
// (several rows, mixed kinds), on any thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "runtime/model/dense_ops.h"
#include "tests/support/random_blocks.h"

namespace moestream {
namespace {

// A rows x cols matrix of ggml type t (f16 factors at the block's start, level bytes random), or f32.
struct Owned {
  std::vector<uint8_t> bytes;
  DenseMatrix m;
};

Owned random_dense(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  Owned o;
  const QuantType q = t == GgmlType::kF32 ? QuantType::kF32 : ggml_quant(t);
  o.bytes.resize(quant_matrix_bytes(q, rows, cols));
  std::normal_distribution<float> g(0.0f, 1.0f);
  if (t == GgmlType::kF32) {
    for (size_t i = 0; i < rows * cols; ++i) {
      const float v = g(rng);
      std::memcpy(&o.bytes[4 * i], &v, 4);
    }
  } else {
    test::fill_random_blocks(t, o.bytes.data(), o.bytes.size(), 0.01f, rng);
  }
  o.m = {q, rows, cols, o.bytes.data()};
  return o;
}

// What each matrix's product alone gives, row of x by row of x.
std::vector<float> expected(const DenseMatrix& w, const std::vector<float>& x, size_t T) {
  std::vector<float> y(T * w.rows);
  for (size_t t = 0; t < T; ++t) {
    if (w.type == QuantType::kF32) {
      const ConstRowMap wm(reinterpret_cast<const float*>(w.data), Eigen::Index(w.rows), Eigen::Index(w.cols));
      const Eigen::Map<const Eigen::VectorXf> xv(x.data() + t * w.cols, Eigen::Index(w.cols));
      Eigen::Map<Eigen::VectorXf>(y.data() + t * w.rows, Eigen::Index(w.rows)) = wm * xv;
    } else {
      quant_matvec(w.type, w.data, w.cols, x.data() + t * w.cols, y.data() + t * w.rows, 0, w.rows);
    }
  }
  return y;
}

void check_group(const std::vector<GgmlType>& types, size_t T, int threads, const std::string& name) {
  std::mt19937 rng(17);
  const size_t cols = 4096;  // typed slices of 28-56 rows: every matrix spans several
  const size_t rows[] = {300, 70, 45, 20};
  std::vector<Owned> mats;
  for (size_t i = 0; i < types.size(); ++i) mats.push_back(random_dense(types[i], rows[i], cols, rng));
  std::vector<float> x(T * cols);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& v : x) v = g(rng);
  std::vector<std::vector<float>> ys;
  std::vector<RowMap> maps;
  maps.reserve(mats.size());
  for (const Owned& o : mats) {
    ys.emplace_back(T * o.m.rows, -1.0f);
    maps.emplace_back(ys.back().data(), Eigen::Index(T), Eigen::Index(o.m.rows));
  }
  std::vector<const DenseMatrix*> ws;
  std::vector<RowMap*> out;
  for (size_t i = 0; i < mats.size(); ++i) {
    ws.push_back(&mats[i].m);
    out.push_back(&maps[i]);
  }
  ThreadPool pool(threads);
  linear_group(pool, ConstRowMap(x.data(), Eigen::Index(T), Eigen::Index(cols)), ws, out);
  for (size_t i = 0; i < mats.size(); ++i) {
    const std::vector<float> want = expected(mats[i].m, x, T);
    const std::string where = name + ", matrix " + std::to_string(i) + ", " + std::to_string(threads) + " threads";
    if (mats[i].m.type == QuantType::kF32) {  // Eigen's sliced gemv against its whole product
      for (size_t r = 0; r < want.size(); ++r)
        EXPECT_NEAR(ys[i][r], want[r], 1e-4f * (1.0f + std::fabs(want[r]))) << where << " element " << r;
      continue;
    }
    EXPECT_EQ(std::memcmp(ys[i].data(), want.data(), want.size() * 4), 0) << where;
  }
}

TEST(LinearGroup, OneKindIsFusedAndEachMatrixGetsItsOwnBits) {
  for (int threads : {1, 3})
    check_group({GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ8_0}, 1, threads, "q8_0/q4_0/q8_0, one row");
  for (int threads : {1, 3})  // the super-block kind: K-quants beside the lattice and ternary types
    check_group({GgmlType::kIQ2_XXS, GgmlType::kQ4_K, GgmlType::kIQ1_M, GgmlType::kTQ2_0}, 1, threads,
                "iq2_xxs/q4_k/iq1_m/tq2_0, one row");
}

TEST(LinearGroup, MixedKindsAndSeveralRowsGoOneByOne) {
  for (int threads : {1, 3}) {
    check_group({GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kF32}, 1, threads, "q8_0/q6_k/f32, one row");
    check_group({GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kF32}, 3, threads, "q8_0/q6_k/f32, three rows");
    check_group({GgmlType::kQ8_0, GgmlType::kQ4_0}, 3, threads, "q8_0/q4_0, three rows");
  }
}

}  // namespace
}  // namespace moestream
