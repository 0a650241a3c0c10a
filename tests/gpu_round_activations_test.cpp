// gpu::round_activations against the CPU kernels' own rounding, bit for bit: for every ggml type
// the GPU rounds a matrix's input exactly as kernels/cpu/ggml_{legacy,kquants}.cpp do (32-wide
// blocks with a float16 scale; 256-wide blocks with a float32 scale), so the two backends compute
// the same function; and the q8 packs' rounding (gpu::round_activations_q8) as the CPU's
// quant_matvec does it. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ggml_kquants_kernels.h"
#include "kernels/cpu/ggml_legacy_kernels.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/round_activations.h"
#include "loader/format/expert_file.h"
#include "tests/support/require_gpu.h"

namespace moestream {
namespace {

constexpr int kRows = 3, kCols = 768;  // whole 32- and 256-wide blocks

// Rows of normal values with a spread of magnitudes, one all-zero block and one lone spike.
std::vector<float> inputs() {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(size_t(kRows) * kCols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * float(1 + i % 97) * 0.01f;
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
  x[kCols + 5] = 300.0f;
  return x;
}

// The CPU's rounded inputs: d[b] * q[i], as its integer products see them.
std::vector<float> cpu_rounded(GgmlType t, const std::vector<float>& x) {
  std::vector<float> out(x.size());
  const bool kquant = detail::ggml_kquant_kernels(t) != nullptr;
  if (kquant) {
    const size_t nb = kCols / 256;
    std::vector<float> d(nb);
    std::vector<int8_t> q(kCols);
    std::vector<int16_t> bsums(nb * 16);
    for (int r = 0; r < kRows; ++r) {
      detail::kquant_round_activations(x.data() + size_t(r) * kCols, kCols, d.data(), q.data(), bsums.data());
      for (int c = 0; c < kCols; ++c) out[size_t(r) * kCols + c] = float(q[c]) * d[size_t(c) / 256];
    }
    return out;
  }
  const detail::GgmlActivations a = detail::ggml_round_activations(x.data(), kCols, kRows, false);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c)
      out[size_t(r) * kCols + c] = float(a.qs[(size_t(r) * a.stride) * 32 + c]) * a.d[size_t(r) * a.stride + c / 32];
  return out;
}

TEST(GpuRoundActivations, EveryGgmlTypeRoundsAsTheCpuKernels) {
  REQUIRE_GPU();
  const std::vector<float> x = inputs();
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, x.size() * sizeof(float)), cudaSuccess);
  const GgmlType rounded[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                              GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4, GgmlType::kQ2_K,
                              GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                              GgmlType::kIQ4_XS, GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S,
                              GgmlType::kIQ3_XXS, GgmlType::kIQ3_S, GgmlType::kIQ1_S, GgmlType::kIQ1_M,
                              GgmlType::kTQ1_0, GgmlType::kTQ2_0, GgmlType::kNVFP4};
  for (GgmlType t : rounded) {
    const QuantType q = ggml_quant(t);
    ASSERT_EQ(cudaMemcpy(dev, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(gpu::round_activations(q, dev, dev, kRows, kCols, nullptr)) << quant_name(q);
    std::vector<float> got(x.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dev, x.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    const std::vector<float> want = cpu_rounded(t, x);
    size_t changed = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
          << quant_name(q) << " element " << i << ": gpu " << got[i] << " cpu " << want[i] << " input " << x[i];
      changed += got[i] != x[i];
    }
    EXPECT_GT(changed, x.size() / 2) << quant_name(q) << ": the rounding left most inputs unchanged";
    std::printf("[ round_activations %s ] %zu of %zu inputs rounded, bit-identical to the CPU\n",
                std::string(quant_name(q)).c_str(), changed, x.size());
  }
  // Float types are multiplied as floats on both backends: nothing to do, nothing launched.
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16})
    EXPECT_FALSE(gpu::round_activations(ggml_quant(t), dev, dev, kRows, kCols, nullptr));
  EXPECT_FALSE(gpu::round_activations(QuantType::kBF16, dev, dev, kRows, kCols, nullptr));
  EXPECT_THROW(gpu::round_activations(ggml_quant(GgmlType::kQ4_K), dev, dev, kRows, 512 + 32, nullptr), ConfigError);
  cudaFree(dev);
}

TEST(GpuRoundActivations, MatchesTheCpuActivationQuantisationBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const auto& [rows, cols] : {std::pair{3, 80}, std::pair{5, 67}, std::pair{2, 256}, std::pair{1, 33}}) {
    std::vector<float> x(size_t(rows) * cols);
    for (float& v : x) v = nd(rng);
    for (int c = 0; c < std::min(cols, 32); ++c) x[size_t(c)] = 0.0f;  // an all-zero block stays zero
    std::vector<float> want(x.size());
    const size_t nb = size_t(cols + 31) / 32;
    std::vector<float> d(nb), sum8(nb);
    std::vector<int8_t> qs(nb * 32), pairs(nb * 32);
    std::vector<uint8_t> abs_qs(nb * 32);
    for (int r = 0; r < rows; ++r) {
      detail::quantize_activations(x.data() + size_t(r) * cols, size_t(cols), d.data(), qs.data(),
                                   abs_qs.data(), sum8.data(), pairs.data());
      for (int c = 0; c < cols; ++c)
        want[size_t(r) * cols + c] = float(qs[size_t(c)]) * d[size_t(c) / 32];
    }
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    gpu::round_activations_q8(dev, rows, cols, nullptr);
    std::vector<float> got(x.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dev, x.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dev);
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += got[i] != want[i];
    std::printf("[ round_activations_q8 ] n=%zu worst error / tolerance = %.3f\n", x.size(),
                double(differ));
    EXPECT_EQ(differ, 0u) << rows << "x" << cols;
  }
}

}  // namespace
}  // namespace moestream
