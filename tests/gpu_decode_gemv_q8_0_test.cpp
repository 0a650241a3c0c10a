// ggml Q8_0's decode GEMV (kernels/cuda/decode_gemv_q8_0.cu) through the ops that take it at one
// token row: expert_gemm (groups of one row, also of several), expert_gemm_gate_up, dense_gemm and
// dense_gemm_shared_input (q/k/v heights, the residual add). Its reference is the CPU's ggml_matvec,
// which rounds the input to q8_0 and sums (d_w * d_x) * isum per block: the GPU computes the same
// terms and sums them in another order, so the tolerance is float rounding over nb terms. Widths:
// 256 (one part-filled 32-block segment), 768 (24 blocks), 2048 (two segments), 7168 (DeepSeek-V3's
// hidden size) and 16384 (two token rows per pass fit on chip). Skips without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "loader/format/expert_file.h"
#include "tests/gpu_test_util.h"

namespace moestream {
namespace {

const QuantType kQ8_0 = ggml_quant(GgmlType::kQ8_0);

// rows x cols of Q8_0 blocks: scales of either sign, 1/4096..1/16, quants uniform in [-127, 127].
std::vector<uint8_t> q8_0_matrix(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(1.0f / 4096, 1.0f / 16);
  std::vector<uint8_t> m(size_t(rows) * size_t(cols / 32) * 34);
  for (size_t off = 0; off < m.size(); off += 34) {
    const uint16_t h = f32_to_f16((rng() & 1) ? mag(rng) : -mag(rng));
    std::memcpy(&m[off], &h, 2);
    for (int j = 0; j < 32; ++j) m[off + 2 + size_t(j)] = uint8_t(int8_t(int(rng() % 255) - 127));
  }
  return m;
}

// The CPU's product of each token row of x with the matrix (ggml_matvec: the same rounding).
std::vector<float> cpu_rows(const std::vector<uint8_t>& w, int rows, int cols, const float* x, int n_tokens) {
  std::vector<float> y(size_t(n_tokens) * rows);
  for (int t = 0; t < n_tokens; ++t)
    ggml_matvec(GgmlType::kQ8_0, w.data(), size_t(cols), x + size_t(t) * cols, y.data() + size_t(t) * rows, 0,
                size_t(rows));
  return y;
}

// |gpu - cpu| within 1e-5 * sum_c |w_c * x_c| per output (as gpu_ggml_test): both sum the same
// nb block terms in float, in another order.
void expect_near_cpu(const std::vector<float>& got, const std::vector<float>& want, const std::vector<uint8_t>& w,
                     int rows, int cols, const float* x, size_t first, const std::string& name) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t i = 0; i < want.size(); ++i) {
    const size_t t = i / size_t(rows), r = i % size_t(rows);
    ggml_dequantize_row(GgmlType::kQ8_0, w.data() + r * size_t(cols / 32) * 34, size_t(cols), row.data());
    double scale = 0;
    for (int c = 0; c < cols; ++c) scale += std::fabs(double(row[size_t(c)]) * x[t * size_t(cols) + size_t(c)]);
    const float g = got[first + i];
    ASSERT_TRUE(std::isfinite(g)) << name << " [" << first + i << "] unwritten or not finite";
    ASSERT_NEAR(g, want[i], 1e-5 * scale) << name << " [" << first + i << "]";
  }
}

// Groups of `sizes` token rows, each its own expert (payloads at `offset` in 256-aligned slots).
void check_grouped(int rows, int cols, const std::vector<int>& sizes, uint32_t seed) {
  const int n_groups = int(sizes.size());
  const std::vector<int> row_start = group_row_starts(sizes);
  const int n_rows = row_start.back();
  const size_t offset = 192, mbytes = size_t(rows) * size_t(cols / 32) * 34;
  const size_t stride = (offset + mbytes + 255) / 256 * 256;
  std::vector<uint8_t> pay(stride * size_t(n_groups), 0xa5);
  std::vector<std::vector<uint8_t>> mats;
  for (int g = 0; g < n_groups; ++g) {
    mats.push_back(q8_0_matrix(rows, cols, seed + uint32_t(g)));
    std::memcpy(pay.data() + stride * size_t(g) + offset, mats.back().data(), mbytes);
  }
  const auto x = random_floats(size_t(n_rows) * cols, seed + 100);
  std::vector<float> want(size_t(n_rows) * rows);
  const DeviceGroups groups(pay, stride, row_start);
  DeviceVec<float> dx(x), dy(want.size());
  CUDA_OK(cudaMemset(dy.get(), 0xff, want.size() * sizeof(float)));  // NaN: an unwritten row shows
  gpu::expert_gemm(kQ8_0, groups.weights(), offset, groups.row_start(), n_groups, 1, rows, cols, dx.get(), dy.get(),
                   nullptr);
  std::string name = "Q8_0 expert_gemm " + std::to_string(rows) + "x" + std::to_string(cols) + " groups";
  for (int n : sizes) name += " " + std::to_string(n);
  const auto got = dy.download();
  for (int g = 0; g < n_groups; ++g) {
    const int t0 = row_start[size_t(g)], nt = sizes[size_t(g)];
    if (nt == 0) continue;
    const float* xg = x.data() + size_t(t0) * cols;
    expect_near_cpu(got, cpu_rows(mats[size_t(g)], rows, cols, xg, nt), mats[size_t(g)], rows, cols, xg,
                    size_t(t0) * rows, name + " group " + std::to_string(g));
  }

  // Gate and up in one launch (the same matrices at two offsets): the bits of two expert_gemms.
  DeviceVec<float> g1(want.size()), u1(want.size()), u2(want.size());
  const auto xu = random_floats(x.size(), seed + 200);
  DeviceVec<float> dxu(xu);
  gpu::expert_gemm_gate_up(kQ8_0, groups.weights(), offset, offset, groups.row_start(), n_groups, 1, rows, cols,
                           dx.get(), dxu.get(), g1.get(), u1.get(), nullptr);
  gpu::expert_gemm(kQ8_0, groups.weights(), offset, groups.row_start(), n_groups, 1, rows, cols, dxu.get(), u2.get(),
                   nullptr);
  expect_exact(g1.download(), dy.download(), (name + ": gate_up's gate vs expert_gemm").c_str());
  expect_exact(u1.download(), u2.download(), (name + ": gate_up's up vs expert_gemm").c_str());
}

TEST(GpuDecodeGemvQ8_0, ExpertGemmMatchesTheCpuKernel) {
  SKIP_WITHOUT_GPU();
  check_grouped(96, 2048, {1, 1, 1, 1, 1, 1, 1, 1}, 10);  // Qwen3-30B-A3B's gate/up width
  check_grouped(130, 768, {1, 0, 1, 1}, 20);                 // down's width, an expert unchosen
  check_grouped(33, 256, {3, 0, 6, 1}, 30);                  // groups of several rows: two passes of 4
  check_grouped(17, 7168, {1, 2}, 40);                       // DeepSeek-V3's hidden size
  check_grouped(9, 16384, {3, 1}, 50);                       // two token rows a pass: two passes
}

TEST(GpuDecodeGemvQ8_0, DenseProductsMatchTheCpuKernelAndEachOther) {
  SKIP_WITHOUT_GPU();
  const int cols = 2048, rows[3] = {4096, 512, 520};  // q, k and a height no CTA divides
  std::vector<std::vector<uint8_t>> mats;
  std::vector<std::unique_ptr<DeviceVec<uint8_t>>> dws;
  std::vector<std::unique_ptr<DeviceVec<float>>> ys, singles;
  std::vector<gpu::DenseOut> outs;
  const auto x = random_floats(cols, 7);
  DeviceVec<float> dx(x);
  for (int i = 0; i < 3; ++i) {
    mats.push_back(q8_0_matrix(rows[i], cols, 50 + uint32_t(i)));
    dws.push_back(std::make_unique<DeviceVec<uint8_t>>(mats.back()));
    ys.push_back(std::make_unique<DeviceVec<float>>(size_t(rows[i])));
    singles.push_back(std::make_unique<DeviceVec<float>>(size_t(rows[i])));
    outs.push_back({dws.back()->get(), rows[i], ys.back()->get()});
  }
  ASSERT_TRUE(gpu::dense_gemv_takes(kQ8_0, cols));
  gpu::dense_gemm_shared_input(kQ8_0, outs.data(), 3, cols, dx.get(), 1, nullptr);
  for (int i = 0; i < 3; ++i) {
    gpu::dense_gemm(kQ8_0, dws[size_t(i)]->get(), rows[i], cols, dx.get(), 1, singles[size_t(i)]->get(), nullptr);
    const std::string name = "Q8_0 dense " + std::to_string(rows[i]) + "x" + std::to_string(cols);
    expect_near_cpu(ys[size_t(i)]->download(), cpu_rows(mats[size_t(i)], rows[i], cols, x.data(), 1),
                    mats[size_t(i)], rows[i], cols, x.data(), 0, name);
    expect_exact(ys[size_t(i)]->download(), singles[size_t(i)]->download(), (name + " vs dense_gemm").c_str());
  }
  // An input already rounded to q8_0 (what the forward pass hands it) gives the same bits.
  std::vector<float> xr(x);
  DeviceVec<float> dxr(xr);
  ASSERT_TRUE(gpu::round_activations(kQ8_0, dxr.get(), dxr.get(), 1, cols, nullptr));
  DeviceVec<float> yr{size_t(rows[0])};
  gpu::dense_gemm(kQ8_0, dws[0]->get(), rows[0], cols, dxr.get(), 1, yr.get(), nullptr);
  expect_exact(yr.download(), singles[0]->download(), "Q8_0 dense: rounded input vs raw input");
  // The residual add in the GEMV: x + W a, as dense_gemm then add_inplace.
  const auto resid = random_floats(size_t(rows[2]), 8);
  DeviceVec<float> fused(resid), split(resid);
  const gpu::DenseOut o{dws[2]->get(), rows[2], fused.get(), true};
  gpu::dense_gemm_shared_input(kQ8_0, &o, 1, cols, dx.get(), 1, nullptr);
  gpu::add_inplace(split.get(), singles[2]->get(), size_t(rows[2]), nullptr);
  expect_exact(fused.download(), split.download(), "Q8_0 dense GEMV add vs dense_gemm + add_inplace");
}

TEST(GpuDecodeGemvQ8_0, WidthsItDoesNotTakeKeepTheTileLoop) {
  // 352 columns (11 blocks: rows 2-byte aligned) is not a fit; the tile loop computes it.
  EXPECT_FALSE(gpu::dense_gemv_takes(kQ8_0, 352));
  EXPECT_FALSE(gpu::dense_gemv_takes(kQ8_0, 320));
  EXPECT_TRUE(gpu::dense_gemv_takes(kQ8_0, 256));
  EXPECT_FALSE(gpu::dense_gemv_takes(kQ8_0, 1 << 20));  // its rounded input would not fit on chip
}

}  // namespace
}  // namespace moestream
