// The q8 types' int8 tensor-core product (kernels/cuda/gemm_q8_mma.cu), expert_gemm's and
// dense_gemm's GemmKernel::kInt8Mma for the pack's q8 and ggml's Q8_0:
// - against the CPU's own kernels (quant_matvec, ggml_matmul), which round the input to int8
//   blocks and sum (d_w * d_x) * isum over the blocks as this kernel does: within 1e-5 of
//   sum |w * x| per output (only the order of the float sums differs);
// - against the float tile loop (GemmKernel::kAuto) on the same rounded input;
// - the token-tile hint (max_rows_per_group) below the largest group changes no bit, a rounded
//   input gives the bits of an unrounded one (the rounding is idempotent), and no output past
//   the matrix's rows or the group's tokens is written.
// Shapes: 67 rows (a partial 64-row tile), 128 and 2048 columns (one and 16 stages), groups of
// 0/1/8/9/33/70 rows (empty, partial 8-token tiles, three 32-token tiles), dense 8/40/130 tokens.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "loader/format/expert_file.h"
#include "loader/format/ggml_types.h"
#include "tests/gpu_test_util.h"

namespace moestream {
namespace {

const QuantType kQ8_0 = ggml_quant(GgmlType::kQ8_0);

// A random rows x cols matrix of q: the pack's q8 encodes N(0, 0.05) floats; Q8_0 blocks get an
// f16 scale of either sign (1/4096..1/16) and quants in [-127, 127].
std::vector<uint8_t> random_q8_matrix(QuantType q, int rows, int cols, std::mt19937& rng) {
  std::vector<uint8_t> m(quant_matrix_bytes(q, size_t(rows), size_t(cols)));
  if (q == QuantType::kQ8) {
    std::normal_distribution<float> g(0.0f, 0.05f);
    std::vector<float> f(size_t(rows) * cols);
    for (float& v : f) v = g(rng);
    quantize_matrix(q, f.data(), size_t(rows), size_t(cols), m.data());
    return m;
  }
  std::uniform_real_distribution<float> mag(1.0f / 4096, 1.0f / 16);
  for (size_t off = 0; off < m.size(); off += 34) {
    const uint16_t d = f32_to_f16((rng() & 1) ? mag(rng) : -mag(rng));
    std::memcpy(&m[off], &d, 2);
    for (int i = 0; i < 32; ++i) m[off + 2 + i] = uint8_t(int8_t(int(rng() % 255) - 127));
  }
  return m;
}

// The CPU kernel's y [n, rows] = x [n, cols] W^T, and sum_c |w_c x_c| per output (the error's scale).
struct CpuProduct {
  std::vector<float> y;
  std::vector<double> scale;
};
CpuProduct cpu_product(QuantType q, const std::vector<uint8_t>& w, int rows, int cols,
                       const float* x, int n) {
  CpuProduct p{std::vector<float>(size_t(n) * rows), std::vector<double>(size_t(n) * rows)};
  std::vector<float> wf(size_t(rows) * cols);
  dequantize_matrix(q, w.data(), size_t(rows), size_t(cols), wf.data());
  for (int t = 0; t < n; ++t) {
    const float* xt = x + size_t(t) * cols;
    float* yt = p.y.data() + size_t(t) * rows;
    if (q == QuantType::kQ8) quant_matvec(q, w.data(), size_t(cols), xt, yt, 0, size_t(rows));
    else ggml_matvec(GgmlType::kQ8_0, w.data(), size_t(cols), xt, yt, 0, size_t(rows));
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int c = 0; c < cols; ++c) s += std::fabs(double(wf[size_t(r) * cols + c]) * xt[c]);
      p.scale[size_t(t) * rows + r] = s;
    }
  }
  return p;
}

void expect_near_cpu(const std::vector<float>& gpu, const CpuProduct& cpu, double tol,
                     const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.y.size());
  double worst = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double err = std::fabs(double(gpu[i]) - cpu.y[i]), bound = tol * cpu.scale[i] + 1e-30;
    worst = std::max(worst, err / bound);
    ASSERT_LE(err, bound) << what << " output " << i << ": gpu " << gpu[i] << " cpu " << cpu.y[i];
  }
  std::printf("[ %s ] n=%zu worst error / tolerance = %.3f\n", what.c_str(), gpu.size(), worst);
}

std::string label(QuantType q, int rows, int cols, const std::vector<int>& sizes) {
  std::string s = std::string(quant_name(q)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
  for (int n : sizes) {
    s += ' ';
    s += std::to_string(n);
  }
  return s;
}

// Groups of `sizes` token rows, each against its own random matrix at offset 64 of its payload.
struct Grouped {
  std::vector<int> row_start{0};
  std::vector<std::vector<uint8_t>> mats;
  std::vector<float> x;
  int n_rows = 0, max_rows = 0;
  size_t stride = 0;
};
constexpr size_t kOffset = 64;

Grouped make_grouped(QuantType q, int rows, int cols, const std::vector<int>& sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  Grouped g;
  for (int n : sizes) {
    g.row_start.push_back(g.row_start.back() + n);
    g.mats.push_back(random_q8_matrix(q, rows, cols, rng));
    g.max_rows = std::max(g.max_rows, n);
  }
  g.n_rows = g.row_start.back();
  g.x = random_floats(size_t(g.n_rows) * cols, seed + 1);
  g.stride = (kOffset + g.mats[0].size() + 255) / 256 * 256;
  return g;
}

// expert_gemm of g on the device with the given hint and kernel; x as given (rounded or not).
std::vector<float> run_grouped(QuantType q, int rows, int cols, const Grouped& g,
                               const std::vector<float>& x, int max_rows, gpu::GemmKernel kernel) {
  std::vector<uint8_t> payloads(g.stride * g.mats.size(), 0xa5);
  for (size_t i = 0; i < g.mats.size(); ++i)
    std::memcpy(&payloads[i * g.stride + kOffset], g.mats[i].data(), g.mats[i].size());
  const DeviceGroups groups(payloads, g.stride, g.row_start);
  DeviceVec<float> dx(x), dy(size_t(g.n_rows) * rows + 64);  // 64 guard floats past the end
  EXPECT_EQ(cudaMemset(dy.get(), 0xff, (size_t(g.n_rows) * rows + 64) * sizeof(float)), cudaSuccess);
  gpu::expert_gemm(q, groups.weights(), kOffset, groups.row_start(), int(g.mats.size()), max_rows, rows, cols,
                   dx.get(), dy.get(), nullptr, kernel);
  std::vector<float> y = dy.download();
  for (size_t i = size_t(g.n_rows) * rows; i < y.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &y[i], 4);
    EXPECT_EQ(bits, 0xffffffffu) << "written past the outputs at " << i;
  }
  y.resize(size_t(g.n_rows) * rows);
  return y;
}

std::vector<float> rounded(QuantType q, const std::vector<float>& x, int n, int cols) {
  DeviceVec<float> d(x);
  EXPECT_TRUE(gpu::round_activations(q, d.get(), d.get(), n, cols, nullptr));
  return d.download();
}

TEST(GpuGemmQ8Mma, GroupedMatchesTheCpuKernelsAndTheTileLoop) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int>> groupings = {{8, 0, 33, 1, 70}, {9, 9, 9}};
  uint32_t seed = 10;
  for (QuantType q : {QuantType::kQ8, kQ8_0})
    for (int cols : {128, 2048})
      for (const auto& sizes : groupings) {
        const int rows = 67;
        const Grouped g = make_grouped(q, rows, cols, sizes, seed++);
        const auto mma = run_grouped(q, rows, cols, g, g.x, g.max_rows, gpu::GemmKernel::kInt8Mma);
        CpuProduct cpu;
        for (size_t i = 0; i < g.mats.size(); ++i) {
          const int t0 = g.row_start[i], n = g.row_start[i + 1] - t0;
          const CpuProduct part = cpu_product(q, g.mats[i], rows, cols, g.x.data() + size_t(t0) * cols, n);
          cpu.y.insert(cpu.y.end(), part.y.begin(), part.y.end());
          cpu.scale.insert(cpu.scale.end(), part.scale.begin(), part.scale.end());
        }
        expect_near_cpu(mma, cpu, 1e-5, "expert_gemm mma vs CPU kernel " + label(q, rows, cols, sizes));
        // The tile loop multiplies floats: it needs the input rounded first, as the forward pass does.
        const auto tile = run_grouped(q, rows, cols, g, rounded(q, g.x, g.n_rows, cols), g.max_rows,
                                      gpu::GemmKernel::kAuto);
        expect_near_cpu(tile, cpu, 1e-5, "expert_gemm tile loop vs CPU kernel " + label(q, rows, cols, sizes));
      }
}

TEST(GpuGemmQ8Mma, TheHintAndARoundedInputChangeNoBit) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> sizes = {70, 3, 0, 41};
  for (QuantType q : {QuantType::kQ8, kQ8_0}) {
    const int rows = 130, cols = 256;
    const Grouped g = make_grouped(q, rows, cols, sizes, 77);
    const auto ref = run_grouped(q, rows, cols, g, g.x, g.max_rows, gpu::GemmKernel::kInt8Mma);
    const std::string name = label(q, rows, cols, sizes);
    // Hint 8: one 32-token tile a CTA in z, each CTA walks the group's later tiles itself.
    expect_exact(run_grouped(q, rows, cols, g, g.x, 8, gpu::GemmKernel::kInt8Mma), ref,
                 ("mma hint 8 vs 70 " + name).c_str());
    const auto from_rounded = run_grouped(q, rows, cols, g, rounded(q, g.x, g.n_rows, cols), g.max_rows,
                                          gpu::GemmKernel::kInt8Mma);
    if (q == kQ8_0) {
      // f16 scales: rounding a rounded block finds the same scale and quants, bit for bit.
      expect_exact(from_rounded, ref, ("mma on a rounded input " + name).c_str());
    } else {
      // float scales: amax / 127 of a rounded block may differ from the first scale by an ulp.
      expect_close(from_rounded, ref, 1e-6f, 1e-6f, ("mma on a rounded input " + name).c_str());
    }
  }
}

TEST(GpuGemmQ8Mma, DenseMatchesTheCpuKernels) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (QuantType q : {QuantType::kQ8, kQ8_0})
    for (int n : {8, 40, 130}) {
      const int rows = 67, cols = 384;
      const auto w = random_q8_matrix(q, rows, cols, rng);
      const auto x = random_floats(size_t(n) * cols, 100 + uint32_t(n));
      DeviceVec<uint8_t> dw(w);
      DeviceVec<float> dx(x), dy(size_t(n) * rows);
      gpu::dense_gemm(q, dw.get(), rows, cols, dx.get(), n, dy.get(), nullptr, gpu::GemmKernel::kInt8Mma);
      expect_near_cpu(dy.download(), cpu_product(q, w, rows, cols, x.data(), n), 1e-5,
                      "dense_gemm mma vs CPU kernel " + label(q, rows, cols, {n}));
    }
}

TEST(GpuGemmQ8Mma, OtherTypesAndWidthsAreErrors) {
  SKIP_WITHOUT_GPU();
  DeviceVec<uint8_t> w(quant_matrix_bytes(QuantType::kQ8, 8, 352));
  DeviceVec<float> x(size_t(8) * 352), y(64);
  const auto mma = gpu::GemmKernel::kInt8Mma;
  EXPECT_THROW(gpu::dense_gemm(QuantType::kQ8, w.get(), 8, 352, x.get(), 8, y.get(), nullptr, mma), Error);
  EXPECT_THROW(gpu::dense_gemm(QuantType::kQ4, w.get(), 8, 256, x.get(), 8, y.get(), nullptr, mma), Error);
  EXPECT_THROW(gpu::dense_gemm(ggml_quant(GgmlType::kQ4_K), w.get(), 8, 256, x.get(), 8, y.get(), nullptr, mma),
               Error);
}

}  // namespace
}  // namespace moestream
