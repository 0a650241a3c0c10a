// The decode GEMV (kernels/cuda/decode_gemv.cuh) through the ops that take it: expert_gemm with
// groups of one row, expert_gemm_gate_up, dense_gemm and dense_gemm_shared_input at one token.
// Against the dequantised weights times x summed in double (stated tolerance), and bit for bit
// against the single-matrix calls the fused ones replace. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/gpu_ops.h"
#include "loader/format/expert_file.h"
#include "tests/gpu_test_util.h"

namespace moestream {
namespace {

// n_mats random matrices of rows x cols in type q, each at `offset` in a 256-byte payload slot
// (random junk around it), and their dequantised floats.
struct Matrices {
  size_t offset, stride;
  std::vector<uint8_t> bytes;
  std::vector<std::vector<float>> deq;
};

Matrices make_matrices(QuantType type, int n_mats, int rows, int cols, size_t offset, uint32_t seed) {
  // ggml's BF16 rows are the pack's bf16 rows (quantize_matrix writes only the pack types).
  const QuantType q = type == ggml_quant(GgmlType::kBF16) ? QuantType::kBF16 : type;
  Matrices m{offset, 0, {}, {}};
  m.stride = (offset + quant_matrix_bytes(q, size_t(rows), size_t(cols)) + 255) / 256 * 256;
  m.bytes.resize(m.stride * size_t(n_mats));
  std::mt19937 rng(seed);
  for (auto& b : m.bytes) b = uint8_t(rng());
  for (int i = 0; i < n_mats; ++i) {
    const auto wf = random_floats(size_t(rows) * cols, seed + 10 + uint32_t(i), 0.05f);
    uint8_t* dst = m.bytes.data() + m.stride * size_t(i) + offset;
    quantize_matrix(q, wf.data(), size_t(rows), size_t(cols), dst);
    m.deq.emplace_back(wf.size());
    dequantize_matrix(q, dst, size_t(rows), size_t(cols), m.deq.back().data());
  }
  return m;
}

// y [t, rows] of token row t (x [n, cols]) against matrix deq, in double.
void reference_rows(const std::vector<float>& deq, int rows, int cols, const float* x, float* y) {
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int c = 0; c < cols; ++c) acc += double(deq[size_t(r) * cols + c]) * x[c];
    y[r] = float(acc);
  }
}

// Groups of `sizes` token rows (each group its own expert), max_rows_per_group 1: the GEMV,
// also for groups of several rows (the hint only picks the kernel).
void check_decode_expert_gemm(QuantType q, int rows, int cols, const std::vector<int>& sizes,
                              uint32_t seed) {
  const int n_groups = int(sizes.size());
  const std::vector<int> row_start = group_row_starts(sizes);
  const int n_rows = row_start.back();
  const Matrices m = make_matrices(q, n_groups, rows, cols, 192, seed);
  const auto x = random_floats(size_t(n_rows) * cols, seed + 1);
  std::vector<float> ref(size_t(n_rows) * rows);
  for (int g = 0; g < n_groups; ++g)
    for (int t = row_start[size_t(g)]; t < row_start[size_t(g) + 1]; ++t)
      reference_rows(m.deq[size_t(g)], rows, cols, x.data() + size_t(t) * cols,
                     ref.data() + size_t(t) * rows);
  const DeviceGroups groups(m.bytes, m.stride, row_start);
  DeviceVec<float> dx(x), dy(ref.size());
  CUDA_OK(cudaMemset(dy.get(), 0xff, ref.size() * sizeof(float)));  // NaN: an unwritten row shows
  gpu::expert_gemm(q, groups.weights(), m.offset, groups.row_start(), n_groups, 1, rows, cols, dx.get(), dy.get(),
                   nullptr);
  std::string name = "decode expert_gemm " + std::string(quant_name(q)) + " " +
                     std::to_string(rows) + "x" + std::to_string(cols) + " groups";
  for (int n : sizes) {
    name += ' ';
    name += std::to_string(n);
  }
  // Exact weights, float32 sums of `cols` terms in another order: as the tile-loop GEMM's test.
  expect_close(dy.download(), ref, 2e-4f, 1e-4f, name.c_str());
}

TEST(GpuDecodeGemv, ExpertGemmOneRowPerGroupMatchesDequantisedReference) {
  SKIP_WITHOUT_GPU();
  for (QuantType q : {QuantType::kQ8, QuantType::kQ4}) {
    check_decode_expert_gemm(q, 96, 2048, {1, 1, 1, 1, 1, 1, 1, 1}, 70);  // gate/up: 4 chunks a lane
    check_decode_expert_gemm(q, 130, 768, {1, 0, 1, 1}, 71);  // down's width: part-filled batches
    check_decode_expert_gemm(q, 33, 256, {3, 0, 5}, 72);  // hint 1 on groups of several rows
  }
  check_decode_expert_gemm(QuantType::kBF16, 45, 1000, {1, 1, 1}, 73);  // 125 chunks of 8
  check_decode_expert_gemm(QuantType::kBF16, 67, 8, {1, 2}, 74);        // one chunk
  check_decode_expert_gemm(QuantType::kBF16, 21, 4104, {1, 1}, 75);     // 2 batches + 1 chunk
}

TEST(GpuDecodeGemv, GateUpInOneLaunchEqualsTwoExpertGemmsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (QuantType q : {QuantType::kQ8, QuantType::kQ4, QuantType::kBF16}) {
    const int rows = 80, cols = 512, n_groups = 5;
    // Gate at 64, up after it, in each payload (as an expert file lays them out).
    const size_t gate_off = 64, mbytes = quant_matrix_bytes(q, rows, cols);
    const size_t up_off = (gate_off + mbytes + 63) / 64 * 64;
    const size_t stride = (up_off + mbytes + 255) / 256 * 256;
    std::vector<uint8_t> pay(stride * n_groups);
    for (int g = 0; g < n_groups; ++g)
      for (size_t off : {gate_off, up_off}) {
        const auto wf = random_floats(size_t(rows) * cols, uint32_t(80 + g * 2 + (off == up_off)), 0.05f);
        quantize_matrix(q, wf.data(), rows, cols, pay.data() + stride * size_t(g) + off);
      }
    const std::vector<int> row_start = {0, 1, 2, 2, 3, 4};  // one empty group
    const int n_rows = row_start.back();
    const auto xg = random_floats(size_t(n_rows) * cols, 90), xu = random_floats(xg.size(), 91);
    const DeviceGroups groups(pay, stride, row_start);
    DeviceVec<float> dxg(xg), dxu(xu), g1(size_t(n_rows) * rows), u1(size_t(n_rows) * rows),
        g2(size_t(n_rows) * rows), u2(size_t(n_rows) * rows);
    gpu::expert_gemm_gate_up(q, groups.weights(), gate_off, up_off, groups.row_start(), n_groups, 1, rows, cols,
                             dxg.get(), dxu.get(), g1.get(), u1.get(), nullptr);
    gpu::expert_gemm(q, groups.weights(), gate_off, groups.row_start(), n_groups, 1, rows, cols, dxg.get(), g2.get(),
                     nullptr);
    gpu::expert_gemm(q, groups.weights(), up_off, groups.row_start(), n_groups, 1, rows, cols, dxu.get(), u2.get(),
                     nullptr);
    const std::string name = "expert_gemm_gate_up " + std::string(quant_name(q));
    expect_exact(g1.download(), g2.download(), (name + " gate vs expert_gemm").c_str());
    expect_exact(u1.download(), u2.download(), (name + " up vs expert_gemm").c_str());
    // Groups [0, 2) and [2, 5) in separate launches (a cache too small for the token): same bits.
    DeviceVec<float> g3(size_t(n_rows) * rows), u3(size_t(n_rows) * rows);
    for (auto [a, b] : {std::pair{0, 2}, std::pair{2, 5}})
      gpu::expert_gemm_gate_up(q, groups.weights() + a, gate_off, up_off, groups.row_start() + a, b - a, 1, rows,
                               cols, dxg.get(), dxu.get(), g3.get(), u3.get(), nullptr);
    expect_exact(g3.download(), g2.download(), (name + " split launches").c_str());
    expect_exact(u3.download(), u2.download(), (name + " split launches, up").c_str());
  }
}

TEST(GpuDecodeGemv, DenseSharedInputMatchesReferenceAndDenseGemm) {
  SKIP_WITHOUT_GPU();
  // q/k/v of a small GQA layer: 3 matrices of different heights, one input.
  for (QuantType q : {QuantType::kBF16, QuantType::kQ8, ggml_quant(GgmlType::kBF16)}) {
    const int cols = 768;
    const int rows[3] = {320, 40, 40};
    std::vector<Matrices> ms;
    for (int i = 0; i < 3; ++i) ms.push_back(make_matrices(q, 1, rows[i], cols, 0, 100 + uint32_t(i)));
    const auto x = random_floats(cols, 110);
    DeviceVec<float> dx(x);
    std::vector<std::unique_ptr<DeviceVec<uint8_t>>> dws;
    std::vector<std::unique_ptr<DeviceVec<float>>> ys, singles;
    std::vector<gpu::DenseOut> outs;
    for (int i = 0; i < 3; ++i) {
      dws.push_back(std::make_unique<DeviceVec<uint8_t>>(ms[size_t(i)].bytes));
      ys.push_back(std::make_unique<DeviceVec<float>>(size_t(rows[i])));
      singles.push_back(std::make_unique<DeviceVec<float>>(size_t(rows[i])));
      outs.push_back({dws.back()->get(), rows[i], ys.back()->get()});
    }
    gpu::dense_gemm_shared_input(q, outs.data(), 3, cols, dx.get(), 1, nullptr);
    for (int i = 0; i < 3; ++i) {
      gpu::dense_gemm(q, dws[size_t(i)]->get(), rows[i], cols, dx.get(), 1,
                      singles[size_t(i)]->get(), nullptr);
      std::vector<float> ref(size_t(rows[i]));
      reference_rows(ms[size_t(i)].deq[0], rows[i], cols, x.data(), ref.data());
      const std::string name = "dense_gemm_shared_input " + std::string(quant_name(q)) + " " +
                               std::to_string(rows[i]) + "x" + std::to_string(cols);
      expect_close(ys[size_t(i)]->download(), ref, 2e-4f, 1e-4f, name.c_str());
      expect_exact(ys[size_t(i)]->download(), singles[size_t(i)]->download(),
                   (name + " vs dense_gemm").c_str());
    }
  }
}

TEST(GpuDecodeGemv, AddIntoTheOutputEqualsDenseGemmThenAddInplace) {
  SKIP_WITHOUT_GPU();
  // o_proj's residual add: x += W attn in the GEMV, against dense_gemm into a buffer + add_inplace.
  const int rows = 136, cols = 512;
  const Matrices m = make_matrices(QuantType::kBF16, 1, rows, cols, 0, 130);
  const auto x = random_floats(cols, 131), resid = random_floats(size_t(rows), 132);
  DeviceVec<uint8_t> dw(m.bytes);
  DeviceVec<float> dx(x), fused(resid), split(resid), prod(static_cast<size_t>(rows));
  ASSERT_TRUE(gpu::dense_gemv_takes(QuantType::kBF16, cols));
  const gpu::DenseOut o{dw.get(), rows, fused.get(), true};
  gpu::dense_gemm_shared_input(QuantType::kBF16, &o, 1, cols, dx.get(), 1, nullptr);
  gpu::dense_gemm(QuantType::kBF16, dw.get(), rows, cols, dx.get(), 1, prod.get(), nullptr);
  gpu::add_inplace(split.get(), prod.get(), size_t(rows), nullptr);
  expect_exact(fused.download(), split.download(), "dense GEMV add vs dense_gemm + add_inplace");
  // Where the GEMV does not run (2 tokens), add is refused rather than silently dropped.
  DeviceVec<float> x2(size_t(2) * cols), y2(size_t(2) * rows);
  const gpu::DenseOut o2{dw.get(), rows, y2.get(), true};
  EXPECT_THROW(gpu::dense_gemm_shared_input(QuantType::kBF16, &o2, 1, cols, x2.get(), 2, nullptr),
               Error);
}

TEST(GpuDecodeGemv, Float32GemvMatchesReferenceAddsAndRefusesBadShapes) {
  SKIP_WITHOUT_GPU();
  // The router's shape (128 x 2048) and a width that is not a multiple of the 512 floats a warp
  // loads in one batch.
  for (const auto& [rows, cols] : {std::pair{128, 2048}, std::pair{37, 2884}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const auto w = random_floats(size_t(rows) * cols, 140, 0.05f);
    const auto x = random_floats(size_t(cols), 141);
    const auto resid = random_floats(size_t(rows), 142);
    std::vector<float> ref(static_cast<size_t>(rows));
    reference_rows(w, rows, cols, x.data(), ref.data());
    DeviceVec<float> dw(w), dx(x), y(static_cast<size_t>(rows)), acc(resid);
    gpu::gemv_f32(dw.get(), rows, cols, dx.get(), y.get(), false, nullptr);
    expect_close(y.download(), ref, 2e-4f, 1e-4f, "gemv_f32");
    gpu::gemv_f32(dw.get(), rows, cols, dx.get(), acc.get(), true, nullptr);
    auto sum = y.download();
    for (int r = 0; r < rows; ++r) sum[size_t(r)] += resid[size_t(r)];
    expect_exact(acc.download(), sum, "gemv_f32 add vs the product then the add");
  }
  DeviceVec<float> a(64);
  EXPECT_THROW(gpu::gemv_f32(a.get(), 2, 6, a.get(), a.get(), false, nullptr), Error);  // cols % 4
  EXPECT_THROW(gpu::gemv_f32(a.get() + 1, 2, 8, a.get(), a.get(), false, nullptr), Error);  // alignment
  EXPECT_THROW(gpu::gemv_f32(nullptr, 2, 8, a.get(), a.get(), false, nullptr), Error);
}

TEST(GpuDecodeGemv, ShapesItDoesNotTakeKeepTheTileLoopAndTooManyMatricesAreRefused) {
  SKIP_WITHOUT_GPU();
  // q8 at cols 96 (nb 3: rows not 16-byte aligned) and 2 tokens: the tile loop, still right.
  for (int n_tokens : {1, 2}) {
    const int rows = 24, cols = 96;
    const Matrices m = make_matrices(QuantType::kQ8, 1, rows, cols, 0, 120);
    const auto x = random_floats(size_t(n_tokens) * cols, 121);
    DeviceVec<uint8_t> dw(m.bytes);
    DeviceVec<float> dx(x), dy(size_t(n_tokens) * rows);
    const gpu::DenseOut o{dw.get(), rows, dy.get()};
    gpu::dense_gemm_shared_input(QuantType::kQ8, &o, 1, cols, dx.get(), n_tokens, nullptr);
    std::vector<float> ref(size_t(n_tokens) * rows);
    for (int t = 0; t < n_tokens; ++t)
      reference_rows(m.deq[0], rows, cols, x.data() + size_t(t) * cols, ref.data() + size_t(t) * rows);
    expect_close(dy.download(), ref, 2e-4f, 1e-4f,
                 ("dense_gemm_shared_input q8 24x96 tokens " + std::to_string(n_tokens)).c_str());
  }
  DeviceVec<uint8_t> w(4096);
  DeviceVec<float> x(256), y(64);
  const gpu::DenseOut o{w.get(), 4, y.get()};
  const gpu::DenseOut four[4] = {o, o, o, o};
  EXPECT_THROW(gpu::dense_gemm_shared_input(QuantType::kBF16, four, 4, 256, x.get(), 1, nullptr),
               Error);
  EXPECT_THROW(gpu::dense_gemm_shared_input(QuantType::kBF16, &o, 0, 256, x.get(), 1, nullptr),
               Error);
  const gpu::DenseOut odd{w.get() + 2, 4, y.get()};  // not 16-byte aligned: refused, not misread
  EXPECT_THROW(gpu::dense_gemm_shared_input(QuantType::kBF16, &odd, 1, 256, x.get(), 1, nullptr),
               Error);
}

}  // namespace
}  // namespace moestream
