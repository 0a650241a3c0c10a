// The CUDA weight-matrix ops (dense_gemm, dequantize_rows, expert_gemm, expert_matvec) on every
// ggml block type and the pack encodings, against the CPU (kernels/cpu: dequantize_matrix, i.e.
// ggml_dequantize_row for ggml types, itself bit-exact to gguf.quants):
// - dequantize_rows equals the CPU dequantisation bit for bit (the GPU codecs round each product
//   and sum as the CPU does, no fused multiply-add);
// - the GEMMs are within 1e-5 * sum_c |w_c * x_c| of f64 maths on the dequantised weights, per
//   output (f32 activations and accumulation on the GPU; a lane sums cols/32 products and the
//   warp 32 partial sums, so the rounding error is a few 1e-7 of that sum at these widths).
// Shapes are odd on purpose: 37 rows (partial row tiles), block counts that leave a warp step
// partly empty and rows that start 2- or 1-byte aligned (Q8_0 rows of 11 blocks, MXFP4's 17-byte
// blocks), token counts 1/3/9/67 (the token tiles, and two dense token chunks).
// The GPU tests skip without a usable device; the data generation and error checks run anywhere.
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
#include "loader/format/expert_file.h"
#include "loader/format/ggml_types.h"
#include "tests/gpu_test_util.h"

namespace moestream {
namespace {

struct TypeCase {
  QuantType q;
  size_t cols;  // chosen per type: partial warp steps, odd block counts
};

QuantType gq(GgmlType t) { return ggml_quant(t); }

// Every type the GPU computes, at widths that stress its codec.
const TypeCase kCases[] = {
    {gq(GgmlType::kF32), 333},    {gq(GgmlType::kF32), 336},  {gq(GgmlType::kF16), 333},
    {gq(GgmlType::kF16), 336},    {gq(GgmlType::kBF16), 336}, {gq(GgmlType::kQ8_0), 352},
    {gq(GgmlType::kQ8_0), 320},   {gq(GgmlType::kQ4_0), 352}, {gq(GgmlType::kQ4_1), 352},
    {gq(GgmlType::kQ5_0), 352},   {gq(GgmlType::kQ5_1), 352}, {gq(GgmlType::kIQ4_NL), 352},
    {gq(GgmlType::kMXFP4), 352},  {gq(GgmlType::kMXFP4), 288}, {gq(GgmlType::kQ2_K), 768},
    {gq(GgmlType::kNVFP4), 320},  {gq(GgmlType::kNVFP4), 256},
    {gq(GgmlType::kQ3_K), 768},   {gq(GgmlType::kQ4_K), 768}, {gq(GgmlType::kQ5_K), 768},
    {gq(GgmlType::kQ6_K), 768},   {gq(GgmlType::kQ6_K), 512}, {gq(GgmlType::kIQ4_XS), 768},
    {gq(GgmlType::kIQ2_XXS), 768}, {gq(GgmlType::kIQ2_XS), 768}, {gq(GgmlType::kIQ2_S), 768},
    {gq(GgmlType::kIQ3_XXS), 768}, {gq(GgmlType::kIQ3_XXS), 512}, {gq(GgmlType::kIQ3_S), 768},
    {gq(GgmlType::kIQ1_S), 768},  {gq(GgmlType::kIQ1_M), 768}, {gq(GgmlType::kIQ1_M), 256},
    {gq(GgmlType::kTQ1_0), 768},  {gq(GgmlType::kTQ1_0), 512}, {gq(GgmlType::kTQ2_0), 768},
    {QuantType::kQ8, 352},        {QuantType::kQ8, 320},      {QuantType::kQ4, 352},
    {QuantType::kBF16, 333},      {QuantType::kBF16, 336},    {QuantType::kF32, 333},
};

std::string case_name(const TypeCase& c) {
  return std::string(quant_name(c.q)) + " cols=" + std::to_string(c.cols);
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Offsets of the f16 factors in a block of a ggml block type (d, and m/dmin where there is one).
std::vector<size_t> f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0: case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS: case GgmlType::kIQ2_XXS: case GgmlType::kIQ2_XS: case GgmlType::kIQ2_S:
    case GgmlType::kIQ3_XXS: case GgmlType::kIQ3_S: case GgmlType::kIQ1_S: return {0};
    case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ4_K: case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K: return {80, 82};
    case GgmlType::kQ3_K: return {108};
    case GgmlType::kQ6_K: return {208};
    case GgmlType::kTQ1_0: return {52};
    case GgmlType::kTQ2_0: return {64};
    default: return {};
  }
}

// A valid random rows x cols matrix of type q: the plain and pack types encode N(0,1) floats;
// the ggml block types are random bytes with every scale field set to a finite value of either
// sign (f16 factors of magnitude 1/4096..1/16, IQ1_M's d spread over four nibbles; MXFP4
// exponents mostly near 2^0, some at the subnormal end 0/1 and some at 2^32; NVFP4's UE4M3
// scale bytes stay random: every byte decodes to a finite scale).
std::vector<uint8_t> random_matrix(QuantType q, size_t rows, size_t cols, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t bytes = quant_matrix_bytes(q, rows, cols);
  std::vector<uint8_t> m(bytes);
  const auto t = quant_ggml_type(q);
  const bool plain = !t || *t == GgmlType::kF32 || *t == GgmlType::kF16 || *t == GgmlType::kBF16;
  if (plain) {
    std::vector<float> f(rows * cols);
    for (float& v : f) v = g(rng);
    if (!t) {
      quantize_matrix(q, f.data(), rows, cols, m.data());
    } else if (*t == GgmlType::kF32) {
      std::memcpy(m.data(), f.data(), bytes);
    } else {
      for (size_t i = 0; i < f.size(); ++i) {
        const uint16_t h = *t == GgmlType::kF16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
        std::memcpy(&m[2 * i], &h, 2);
      }
    }
    return m;
  }
  for (uint8_t& b : m) b = static_cast<uint8_t>(rng());
  const auto info = *ggml_type_info(uint32_t(*t));
  std::uniform_real_distribution<float> mag(1.0f / 4096, 1.0f / 16);
  for (size_t off = 0; off < bytes; off += info.block_bytes) {
    for (size_t f : f16_fields(*t)) put_f16(&m[off + f], (rng() & 1) ? mag(rng) : -mag(rng));
    if (*t == GgmlType::kIQ1_M) {  // d's nibbles are the top nibbles of the u16 at 48 + 2w
      const uint16_t h = f32_to_f16((rng() & 1) ? mag(rng) : -mag(rng));
      for (int w = 0; w < 4; ++w)
        m[off + 49 + 2 * w] = uint8_t((m[off + 49 + 2 * w] & 0x0f) | (((h >> (4 * w)) & 0xf) << 4));
    }
    if (*t == GgmlType::kMXFP4) {
      const uint32_t r = rng() % 16;
      m[off] = r == 0 ? 0 : r == 1 ? 1 : r == 2 ? 160 : uint8_t(120 + rng() % 12);
    }
  }
  return m;
}

std::vector<float> dequantize(QuantType q, const std::vector<uint8_t>& w, size_t rows,
                              size_t cols) {
  std::vector<float> out(rows * cols);
  dequantize_matrix(q, w.data(), rows, cols, out.data());
  return out;
}

std::vector<float> random_x(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = g(rng);
  return x;
}

// f64 reference of y[t][r] = W[r] . x[t], and the scale sum_c |W[r][c] * x[t][c]| of its error.
struct Reference {
  std::vector<double> y, scale;
};
Reference reference_gemm(const std::vector<float>& wf, size_t rows, size_t cols,
                         const float* x, size_t n_tokens) {
  Reference r{std::vector<double>(n_tokens * rows), std::vector<double>(n_tokens * rows)};
  for (size_t t = 0; t < n_tokens; ++t)
    for (size_t o = 0; o < rows; ++o) {
      double acc = 0, mag = 0;
      for (size_t c = 0; c < cols; ++c) {
        const double p = double(wf[o * cols + c]) * double(x[t * cols + c]);
        acc += p;
        mag += std::fabs(p);
      }
      r.y[t * rows + o] = acc;
      r.scale[t * rows + o] = mag;
    }
  return r;
}

constexpr double kRelTol = 1e-5;  // of sum |w * x|, per output

// Worst |gpu - ref| / (kRelTol * sum|w*x|) over all outputs; fails (naming the first offender)
// above 1, and prints the table line scripts/device_kernels.sh collects.
void expect_gemm_close(const std::vector<float>& gpu, const Reference& ref,
                       const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.y.size());
  double worst = 0, worst_rel = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double err = std::fabs(double(gpu[i]) - ref.y[i]);
    const double bound = kRelTol * ref.scale[i] + 1e-30;
    worst = std::max(worst, err / bound);
    worst_rel = std::max(worst_rel, err / (ref.scale[i] + 1e-30));
    ASSERT_LE(err, bound) << what << " output " << i << ": gpu " << gpu[i] << " ref " << ref.y[i]
                          << " sum|w*x| " << ref.scale[i];
  }
  std::printf("  %s: max |gpu - f64| / sum|w*x| = %.2e (tolerance %.0e)\n", what.c_str(),
              worst_rel, kRelTol);
  std::printf("[ %s ] n=%zu worst error / tolerance = %.3f\n", what.c_str(), gpu.size(), worst);
}

TEST(GpuGgml, TestDataIsValidOnTheCpu) {
  // Host-only: every case's random matrix decodes to finite, non-constant weights, and the f64
  // reference agrees with the CPU's own matvec (which rounds x to int8: a loose 2e-2 of sum|w*x|).
  std::mt19937 rng(1);
  for (const TypeCase& c : kCases) {
    const size_t rows = 5;
    const auto w = random_matrix(c.q, rows, c.cols, rng);
    const auto wf = dequantize(c.q, w, rows, c.cols);
    size_t nonfinite = 0, distinct = 0;
    for (size_t i = 0; i < wf.size(); ++i) {
      nonfinite += !std::isfinite(wf[i]);
      distinct += i > 0 && wf[i] != wf[i - 1];
    }
    EXPECT_EQ(nonfinite, 0u) << case_name(c);
    EXPECT_GT(distinct, wf.size() / 4) << case_name(c);
    const auto x = random_x(c.cols, rng);
    const Reference ref = reference_gemm(wf, rows, c.cols, x.data(), 1);
    std::vector<float> y(rows);
    if (const auto t = quant_ggml_type(c.q))
      ggml_matvec(*t, w.data(), c.cols, x.data(), y.data(), 0, rows);
    else
      quant_matvec(c.q, w.data(), c.cols, x.data(), y.data(), 0, rows);
    for (size_t r = 0; r < rows; ++r)
      EXPECT_NEAR(y[r], ref.y[r], 2e-2 * ref.scale[r]) << case_name(c) << " row " << r;
  }
}

TEST(GpuGgml, UnsupportedTypesAndWidthsAreConfigErrors) {
  // Host-side checks: they throw before any launch, so they run without a GPU too. The pointers
  // are never dereferenced.
  const auto* w = reinterpret_cast<const uint8_t*>(uintptr_t{4096});
  const auto* x = reinterpret_cast<const float*>(uintptr_t{8192});
  auto* y = reinterpret_cast<float*>(uintptr_t{16384});
  const auto* ids = reinterpret_cast<const int*>(uintptr_t{32768});
  const auto* const* ws = reinterpret_cast<const uint8_t* const*>(uintptr_t{65536});
  const auto expect_config_error = [](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no ConfigError (expected one naming " << needle << ")";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Q8_K is an activation type no file stores, Q8_1 likewise: refused by name.
  for (GgmlType t : {GgmlType::kQ8_K, GgmlType::kQ8_1}) {
    const std::string name(ggml_type_name(t));
    expect_config_error([&] { gpu::dense_gemm(ggml_quant(t), w, 4, 256, x, 1, y, nullptr); }, name);
    expect_config_error([&] { gpu::dequantize_rows(ggml_quant(t), w, 256, ids, 1, y, nullptr); },
                        name);
    expect_config_error(
        [&] { gpu::expert_gemm(ggml_quant(t), ws, 64, ids, 2, 1, 4, 256, x, y, nullptr); }, name);
    expect_config_error([&] { gpu::expert_matvec(ggml_quant(t), w, 4, 256, x, y, nullptr); },
                        name);
  }
  // A row that is not whole blocks.
  expect_config_error(
      [&] { gpu::dense_gemm(gq(GgmlType::kQ4_K), w, 4, 288, x, 1, y, nullptr); }, "Q4_K");
  expect_config_error(
      [&] { gpu::dequantize_rows(gq(GgmlType::kQ5_0), w, 48, ids, 1, y, nullptr); }, "Q5_0");
  expect_config_error(
      [&] { gpu::dense_gemm(gq(GgmlType::kIQ2_XXS), w, 4, 288, x, 1, y, nullptr); }, "IQ2_XXS");
  // Pack f32 experts have no GEMM (dequantize_rows takes them).
  expect_config_error([&] { gpu::dense_gemm(QuantType::kF32, w, 4, 64, x, 1, y, nullptr); },
                      "f32");
  // Misaligned weights are a plain Error (the caller's bug), before any launch.
  EXPECT_THROW(gpu::dense_gemm(gq(GgmlType::kQ8_0), w + 2, 4, 64, x, 1, y, nullptr), Error);
  EXPECT_THROW(gpu::dequantize_rows(gq(GgmlType::kQ8_0), w + 2, 64, ids, 1, y, nullptr), Error);
}

TEST(GpuGgml, DequantizeRowsIsBitExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (const TypeCase& c : kCases) {
    const size_t rows = 37;
    const auto w = random_matrix(c.q, rows, c.cols, rng);
    const auto wf = dequantize(c.q, w, rows, c.cols);
    const std::vector<int> ids = {36, 0, 17, 17, 5, 1, 35, 2, 33};  // repeats, any order
    DeviceVec<uint8_t> dw(w);
    DeviceVec<int> di(ids);
    DeviceVec<float> dout(ids.size() * c.cols);
    gpu::dequantize_rows(c.q, dw.get(), int(c.cols), di.get(), int(ids.size()), dout.get(),
                         nullptr);
    const auto out = dout.download();
    size_t differ = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (size_t col = 0; col < c.cols; ++col) {
        const float a = out[i * c.cols + col], b = wf[size_t(ids[i]) * c.cols + col];
        if (std::memcmp(&a, &b, 4) != 0 && differ++ == 0)
          ADD_FAILURE() << case_name(c) << " row " << ids[i] << " col " << col << ": gpu " << a
                        << " cpu " << b;
      }
    EXPECT_EQ(differ, 0u) << case_name(c);
    // Tolerance 0: the table shows 0 when every bit matches, else the count of differing floats.
    std::printf("[ dequantize_rows %s ] n=%zu worst error / tolerance = %.3f\n",
                case_name(c).c_str(), out.size(), double(differ));
  }
}

TEST(GpuGgml, DenseGemmMatchesF64OnDequantizedWeights) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  for (const TypeCase& c : kCases) {
    if (c.q == QuantType::kF32) continue;  // pack f32: dequantize_rows only
    const size_t rows = 37;
    const auto w = random_matrix(c.q, rows, c.cols, rng);
    const auto wf = dequantize(c.q, w, rows, c.cols);
    DeviceVec<uint8_t> dw(w);
    for (size_t n_tokens : {1, 3, 9, 67}) {
      const auto x = random_x(n_tokens * c.cols, rng);
      DeviceVec<float> dx(x), dy(n_tokens * rows);
      gpu::dense_gemm(c.q, dw.get(), int(rows), int(c.cols), dx.get(), int(n_tokens), dy.get(),
                      nullptr);
      expect_gemm_close(dy.download(), reference_gemm(wf, rows, c.cols, x.data(), n_tokens),
                        "dense_gemm " + case_name(c) + " tokens=" + std::to_string(n_tokens));
      if (n_tokens == 1) {  // expert_matvec dispatches here too
        DeviceVec<float> dy1(rows);
        gpu::expert_matvec(c.q, dw.get(), int(rows), int(c.cols), dx.get(), dy1.get(), nullptr);
        expect_gemm_close(dy1.download(), reference_gemm(wf, rows, c.cols, x.data(), 1),
                          "expert_matvec " + case_name(c));
      }
    }
  }
}

TEST(GpuGgml, ExpertGemmMatchesF64PerGroup) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  // Token rows per group: decode (1 each), small tiles with an empty group, and a group of 9
  // (two tiles of 8); each group's matrix is different and sits at offset 64 in its payload.
  const std::vector<std::vector<int>> groupings = {{1, 1, 1, 1, 1}, {3, 1, 0, 3}, {9, 1, 3, 0, 5}};
  const size_t kOffset = 64;
  for (const TypeCase& c : kCases) {
    if (c.q == QuantType::kF32) continue;
    const size_t rows = 37, mbytes = quant_matrix_bytes(c.q, rows, c.cols);
    const size_t stride = (kOffset + mbytes + 63) / 64 * 64;
    for (const auto& sizes : groupings) {
      const size_t n_groups = sizes.size();
      std::vector<uint8_t> payloads(n_groups * stride);
      std::vector<std::vector<float>> wf(n_groups);
      for (size_t g = 0; g < n_groups; ++g) {
        const auto w = random_matrix(c.q, rows, c.cols, rng);
        std::memcpy(&payloads[g * stride + kOffset], w.data(), mbytes);
        wf[g] = dequantize(c.q, w, rows, c.cols);
      }
      const std::vector<int> row_start = group_row_starts(sizes);
      const size_t n_rows = size_t(row_start.back());
      const int max_rows = *std::max_element(sizes.begin(), sizes.end());
      const auto x = random_x(n_rows * c.cols, rng);
      const DeviceGroups groups(payloads, stride, row_start);
      DeviceVec<float> dx(x), dy(n_rows * rows);
      gpu::expert_gemm(c.q, groups.weights(), kOffset, groups.row_start(), int(n_groups), max_rows, int(rows),
                       int(c.cols), dx.get(), dy.get(), nullptr);
      const auto y = dy.download();
      Reference ref;
      for (size_t g = 0; g < n_groups; ++g) {
        const size_t t0 = size_t(row_start[g]), nt = size_t(sizes[g]);
        const Reference rg = reference_gemm(wf[g], rows, c.cols, x.data() + t0 * c.cols, nt);
        ref.y.insert(ref.y.end(), rg.y.begin(), rg.y.end());
        ref.scale.insert(ref.scale.end(), rg.scale.begin(), rg.scale.end());
      }
      std::string shape;
      for (int s : sizes) {
        if (!shape.empty()) shape += ',';
        shape += std::to_string(s);
      }
      expect_gemm_close(y, ref, "expert_gemm " + case_name(c) + " groups=" + shape);
    }
  }
}

}  // namespace
}  // namespace moestream
