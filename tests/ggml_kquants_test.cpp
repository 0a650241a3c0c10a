// Tests of the super-block kernels (kernels/cpu/ggml_kquants*.cpp, ggml_iquants.cpp: K-quants,
// IQ4_XS, the IQ1/IQ2/IQ3 lattice types, TQ1_0, TQ2_0): the AVX2 activation rounding and
// products against the scalar reference, both against f64 maths on the dequantised weights, matmul
// against matvec, odd row ranges, and no allocation once the scratch is reserved. Bit-exactness of
// the dequantisation against the gguf package is tests/python/test_ggml_kquants.py.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_kquants_kernels.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant_kernels.h"

// Counts this thread's allocations while enabled (the scratch test).
namespace {
thread_local bool t_counting = false;
thread_local long t_allocs = 0;
}  // namespace
void* operator new(size_t n) {
  if (t_counting) ++t_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

using namespace moestream;

namespace {

struct TypeCase {
  GgmlType type;
  std::vector<size_t> f16_at;  // byte offsets of the f16 factors in a block (IQ1_M: see set_f16)
  std::vector<std::pair<size_t, size_t>> quant_bytes;  // [begin, end) of the quant bits (mins types)
};

const TypeCase kTypes[] = {
    {GgmlType::kQ2_K, {80, 82}, {{16, 80}}},
    {GgmlType::kQ3_K, {108}, {}},
    {GgmlType::kQ4_K, {0, 2}, {{16, 144}}},
    {GgmlType::kQ5_K, {0, 2}, {{16, 176}}},
    {GgmlType::kQ6_K, {208}, {}},
    {GgmlType::kIQ4_XS, {0}, {}},
    {GgmlType::kIQ2_XXS, {0}, {}},
    {GgmlType::kIQ2_XS, {0}, {}},
    {GgmlType::kIQ2_S, {0}, {}},
    {GgmlType::kIQ3_XXS, {0}, {}},
    {GgmlType::kIQ3_S, {0}, {}},
    {GgmlType::kIQ1_S, {0}, {}},
    {GgmlType::kIQ1_M, {48}, {}},
    {GgmlType::kTQ1_0, {52}, {}},
    {GgmlType::kTQ2_0, {64}, {}},
};

// Writes the f16 h as the factor at `off` of a block. IQ1_M keeps its d in the top nibbles of the
// four u16 at 48..55 (nibble w = bits 4w..4w+3), below them the scales, which stay.
void set_f16(GgmlType t, uint8_t* block, size_t off, uint16_t h) {
  if (t != GgmlType::kIQ1_M) {
    std::memcpy(block + off, &h, 2);
    return;
  }
  for (int w = 0; w < 4; ++w) {
    uint16_t v;
    std::memcpy(&v, block + off + 2 * w, 2);
    v = static_cast<uint16_t>((v & 0x0fff) | (((h >> (4 * w)) & 0xf) << 12));
    std::memcpy(block + off + 2 * w, &v, 2);
  }
}

size_t block_bytes(GgmlType t) { return ggml_type_info(uint32_t(t))->block_bytes; }

// rows x cols of random bytes whose f16 factors are moderate, of either sign.
std::vector<uint8_t> random_matrix(const TypeCase& tc, size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bb = block_bytes(tc.type), n_blocks = rows * cols / detail::kSuperBlock;
  std::vector<uint8_t> w(n_blocks * bb);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mag(1.0f / 4096, 1.0f / 16);
  for (size_t b = 0; b < n_blocks; ++b) {
    for (size_t off : tc.f16_at) {
      set_f16(tc.type, &w[b * bb], off, f32_to_f16((rng() & 1) ? mag(rng) : -mag(rng)));
    }
  }
  return w;
}

std::vector<float> random_x(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  for (size_t i = 0; i < n; i += 97) x[i] *= 8.0f;  // outliers stress the per-256 scale
  return x;
}

std::vector<float> dequantize(GgmlType t, const std::vector<uint8_t>& w, size_t rows, size_t cols) {
  std::vector<float> out(rows * cols);
  const size_t row_bytes = *ggml_row_bytes(t, cols);
  for (size_t r = 0; r < rows; ++r) ggml_dequantize_row(t, w.data() + r * row_bytes, cols, out.data() + r * cols);
  return out;
}

// The minimum term of every weight (dmin * min, as the value of a block whose quants are zero),
// bounding the cancellation inside (d * scale) * q - dmin * min; zeros for types without one.
std::vector<float> min_terms(const TypeCase& tc, std::vector<uint8_t> w, size_t rows, size_t cols) {
  if (tc.quant_bytes.empty()) return std::vector<float>(rows * cols, 0.0f);
  const size_t bb = block_bytes(tc.type);
  for (size_t b = 0; b < w.size() / bb; ++b)
    for (auto [lo, hi] : tc.quant_bytes) std::memset(&w[b * bb + lo], 0, hi - lo);
  return dequantize(tc.type, w, rows, cols);
}

struct Rounded {
  std::vector<float> d;
  std::vector<int8_t> qs;
  std::vector<int16_t> bsums;
  explicit Rounded(size_t cols) : d(cols / 256), qs(cols), bsums(cols / 16) {}
};

const detail::GgmlKernels& kernels(GgmlType t) { return *detail::ggml_kquant_kernels(t); }

bool avx2() { return detail::avx2_usable() && kernels(GgmlType::kQ4_K).matvec_avx2 != nullptr; }

TEST(GgmlKquants, TableCoversExactlyTheSuperBlockTypes) {
  for (const auto& tc : kTypes) {
    EXPECT_NE(detail::ggml_kquant_kernels(tc.type), nullptr) << ggml_type_name(tc.type);
    EXPECT_TRUE(ggml_type_computable(tc.type));
  }
  EXPECT_EQ(detail::ggml_kquant_kernels(GgmlType::kQ8_K), nullptr);
  EXPECT_EQ(detail::ggml_kquant_kernels(GgmlType::kQ4_0), nullptr);
  EXPECT_EQ(detail::ggml_kquant_kernels(GgmlType::kIQ4_NL), nullptr);
  EXPECT_FALSE(ggml_type_computable(GgmlType::kQ8_K));  // an activation type: no file stores it
  for (GgmlType t : {GgmlType::kI8, GgmlType::kI16, GgmlType::kI32, GgmlType::kI64, GgmlType::kF64})
    EXPECT_FALSE(ggml_type_computable(t)) << ggml_type_name(t);
}

// One value by hand per lattice type, from the tables' first entries and the layouts of
// docs/format.md (gguf's bit-exact comparison is tests/python/test_ggml_iquants.py).
TEST(GgmlKquants, LatticeBlocksDecodeByHand) {
  std::vector<float> out(256);
  const uint16_t one = f32_to_f16(1.0f);
  // IQ2_XXS: d = 1, group 0: grid index 0 (all 8s) for columns 0-7, sign index 1 (byte 0x81:
  // columns 0 and 7 negative), scale 3: (1 / 8) * 7 * 8 = 7.
  std::vector<uint8_t> b(66, 0);
  std::memcpy(&b[0], &one, 2);
  const uint32_t aux = 1u | (3u << 28);
  std::memcpy(&b[6], &aux, 4);
  ggml_dequantize_row(GgmlType::kIQ2_XXS, b.data(), 256, out.data());
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(out[1], 7.0f);
  EXPECT_EQ(out[7], -7.0f);
  EXPECT_EQ(out[8], 7.0f);    // sign index 0 for columns 8-15
  EXPECT_EQ(out[32], 1.0f);   // group 1: scale 0, (1 / 8) * 1 * 8
  // IQ3_XXS: d = 1, index 5 = {62, 12, 4, 4} for columns 0-3, index 0 = {4, 4, 4, 4} next; sign
  // index 3 (byte 0x03: columns 0 and 1 negative), scale 1: d * 1.5 * 0.5 = 0.75.
  b.assign(98, 0);
  std::memcpy(&b[0], &one, 2);
  b[2] = 5;
  const uint32_t aux3 = 3u | (1u << 28);
  std::memcpy(&b[66], &aux3, 4);
  ggml_dequantize_row(GgmlType::kIQ3_XXS, b.data(), 256, out.data());
  EXPECT_EQ(out[0], -46.5f);
  EXPECT_EQ(out[1], -9.0f);
  EXPECT_EQ(out[2], 3.0f);
  EXPECT_EQ(out[4], 3.0f);
  // IQ1_M: d = 1 (0x3c00) in the top nibbles of the u16 at 48..55, scale 0 = 2 (factor 5) for
  // columns 0-15. Columns 0-7: index 1 (= {1, -1, ...}), delta +1/8; columns 8-15: index 0 (all
  // -1), delta -1/8 (bit 3 of qh[0]'s high nibble); column 16: scale 1 = 0 (factor 1), delta +1/8.
  b.assign(56, 0);
  b[0] = 1;
  b[32] = 0x80;
  const uint16_t words[4] = {0x0002, 0x0000, 0xc000, 0x3000};
  std::memcpy(&b[48], words, 8);
  ggml_dequantize_row(GgmlType::kIQ1_M, b.data(), 256, out.data());
  EXPECT_EQ(out[0], 5.625f);
  EXPECT_EQ(out[1], -4.375f);
  EXPECT_EQ(out[8], -5.625f);
  EXPECT_EQ(out[16], -0.875f);
  // TQ2_0: d = 1, byte 0 = 0b00'10'01'00: column 0 -> -1, 32 -> 0, 64 -> 1, 96 -> -1.
  b.assign(66, 0x55);  // 1 everywhere: value 0
  b[0] = 0x24;
  std::memcpy(&b[64], &one, 2);
  ggml_dequantize_row(GgmlType::kTQ2_0, b.data(), 256, out.data());
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[32], 0.0f);
  EXPECT_EQ(out[64], 1.0f);
  EXPECT_EQ(out[96], -1.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(GgmlKquants, Q4KBlockDecodesByHand) {
  // d = 0.5, dmin = 0.25; scale 0 = 3, min 0 = 5; first quant byte 0x72 (low nibble 2 = column 0,
  // high nibble 7 = column 32 of sub-block 1, whose scale and min are 0).
  std::vector<uint8_t> b(144, 0);
  const uint16_t d = f32_to_f16(0.5f), dmin = f32_to_f16(0.25f);
  std::memcpy(&b[0], &d, 2);
  std::memcpy(&b[2], &dmin, 2);
  b[4] = 3;
  b[8] = 5;
  b[16] = 0x72;
  std::vector<float> out(256);
  ggml_dequantize_row(GgmlType::kQ4_K, b.data(), 256, out.data());
  EXPECT_EQ(out[0], 0.5f * 3 * 2 - 0.25f * 5);
  EXPECT_EQ(out[1], -0.25f * 5);
  EXPECT_EQ(out[32], 0.0f);
}

TEST(GgmlKquants, Avx2RoundingEqualsScalarBitForBit) {
  if (!avx2()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  const size_t cols = 256 * 9;
  std::vector<float> x = random_x(cols, 5);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);            // an all-zero super-block
  x[512] = 127.0f;  // step 1: the others are exact ties, rounded to even by both
  for (size_t c = 513; c < 768; ++c) x[c] = (c % 2 ? 1.0f : -1.0f) * (float(c % 120) + 0.5f);
  Rounded a(cols), b(cols);
  detail::kquant_round_activations(x.data(), cols, a.d.data(), a.qs.data(), a.bsums.data());
  detail::kquant_round_activations_avx2(x.data(), cols, b.d.data(), b.qs.data(), b.bsums.data());
  EXPECT_EQ(0, std::memcmp(a.d.data(), b.d.data(), a.d.size() * 4));
  EXPECT_EQ(a.qs, b.qs);
  EXPECT_EQ(a.bsums, b.bsums);
  for (size_t c = 0; c < cols; ++c) {
    const float d = a.d[c / 256];
    ASSERT_LE(std::abs(a.qs[c]), 127);
    ASSERT_LE(std::fabs(x[c] - d * a.qs[c]), d * 0.5f * 1.0001f) << c;
  }
  for (size_t k = 0; k < cols / 16; ++k) {
    int s = 0;
    for (size_t e = 0; e < 16; ++e) s += a.qs[k * 16 + e];
    ASSERT_EQ(a.bsums[k], s) << k;
  }
}

// One type at one shape: scalar and AVX2 against f64 over the rounded activations (tight: only
// float rounding differs), against f64 over the exact inputs (the rounding bound), and each other.
void check_products(const TypeCase& tc, size_t rows, size_t cols, uint32_t seed) {
  SCOPED_TRACE(std::string(ggml_type_name(tc.type)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
  const auto w = random_matrix(tc, rows, cols, seed);
  const auto wf = dequantize(tc.type, w, rows, cols);
  const auto mins = min_terms(tc, w, rows, cols);
  const auto x = random_x(cols, seed + 1);
  Rounded xa(cols);
  detail::kquant_round_activations(x.data(), cols, xa.d.data(), xa.qs.data(), xa.bsums.data());
  std::vector<float> ys(rows), yv(rows);
  kernels(tc.type).matvec_scalar(w.data(), cols, x.data(), ys.data(), 0, rows);
  if (avx2()) kernels(tc.type).matvec_avx2(w.data(), cols, x.data(), yv.data(), 0, rows);
  for (size_t r = 0; r < rows; ++r) {
    double ref_rounded = 0, ref_exact = 0, mag = 0, bound = 0;
    for (size_t c = 0; c < cols; ++c) {
      const double xr = double(xa.d[c / 256]) * xa.qs[c], wv = wf[r * cols + c];
      ref_rounded += wv * xr;
      ref_exact += wv * double(x[c]);
      mag += (std::fabs(wv) + 2 * std::fabs(double(mins[r * cols + c]))) * std::fabs(xr);
      bound += std::fabs(wv) * xa.d[c / 256] * 0.5;
    }
    // Float error: a few roundings per super-block term and one per term summed, each at most
    // 2^-24 of the magnitude bound mag; 1e-5 covers up to ~100 super-blocks.
    const double tol = 1e-5 * mag + 1e-30;
    EXPECT_NEAR(ys[r], ref_rounded, tol) << "scalar, row " << r;
    EXPECT_LE(std::fabs(ys[r] - ref_exact), bound * 1.0001 + tol) << "scalar vs exact inputs, row " << r;
    if (avx2()) {
      EXPECT_NEAR(yv[r], ref_rounded, tol) << "avx2, row " << r;
      EXPECT_NEAR(yv[r], ys[r], tol) << "avx2 vs scalar, row " << r;
    }
  }
}

TEST(GgmlKquants, ProductsMatchF64OneSuperBlock) {
  for (const auto& tc : kTypes) check_products(tc, 37, 256, 11);
}

TEST(GgmlKquants, ProductsMatchF64ManySuperBlocks) {
  for (const auto& tc : kTypes) check_products(tc, 9, 256 * 67, 12);
}

TEST(GgmlKquants, ProductsMatchF64ModelShapes) {
  for (const auto& tc : kTypes) check_products(tc, 24, 2048, 13);
}

// Matmul equals matvec input by input (bit for bit), on odd row ranges, writing nothing else.
void check_matmul(const TypeCase& tc, bool use_avx2) {
  SCOPED_TRACE(std::string(ggml_type_name(tc.type)) + (use_avx2 ? " avx2" : " scalar"));
  const auto& k = kernels(tc.type);
  const auto matvec = use_avx2 ? k.matvec_avx2 : k.matvec_scalar;
  const auto matmul = use_avx2 ? k.matmul_avx2 : k.matmul_scalar;
  const size_t rows = 29, cols = 768, stride = 31;
  const auto w = random_matrix(tc, rows, cols, 21);
  for (size_t n : {1, 2, 3, 4, 5, 9}) {
    const auto x = random_x(n * cols, 22 + uint32_t(n));
    for (auto [rb, re] : {std::pair<size_t, size_t>{0, rows}, {3, 20}, {17, 18}, {28, 29}, {5, 5}}) {
      std::vector<float> y(n * stride, 12345.0f);
      matmul(w.data(), cols, x.data(), n, y.data(), stride, rb, re);
      for (size_t i = 0; i < n; ++i) {
        std::vector<float> yi(rows, -7.0f);
        matvec(w.data(), cols, x.data() + i * cols, yi.data(), rb, re);
        for (size_t r = 0; r < stride; ++r) {
          if (r >= rb && r < re) {
            ASSERT_EQ(0, std::memcmp(&y[i * stride + r], &yi[r], 4)) << "n " << n << " input " << i << " row " << r;
          } else {
            ASSERT_EQ(y[i * stride + r], 12345.0f) << "wrote outside [" << rb << ", " << re << ")";
            if (r < rows) ASSERT_EQ(yi[r], -7.0f);
          }
        }
      }
    }
  }
}

TEST(GgmlKquants, MatmulEqualsMatvecScalar) {
  for (const auto& tc : kTypes) check_matmul(tc, false);
}

TEST(GgmlKquants, MatmulEqualsMatvecAvx2) {
  if (!avx2()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  for (const auto& tc : kTypes) check_matmul(tc, true);
}

TEST(GgmlKquants, ReservedScratchMeansNoAllocation) {
  const auto& tc = kTypes[2];
  const size_t rows = 8, cols = 4096;
  const auto w = random_matrix(tc, rows, cols, 31);
  const auto x = random_x(4 * cols, 32);
  long fresh = -1, reserved = -1;
  std::vector<float> y(4 * rows);
  std::thread([&] {  // a new thread: its first call must size the scratch
    t_counting = true;
    ggml_matvec(tc.type, w.data(), cols, x.data(), y.data(), 0, rows);
    t_counting = false;
    fresh = t_allocs;
  }).join();
  std::thread([&] {
    ggml_reserve_scratch(cols, 4);
    t_allocs = 0;
    t_counting = true;
    ggml_matvec(tc.type, w.data(), cols, x.data(), y.data(), 0, rows);
    ggml_matmul(tc.type, w.data(), cols, x.data(), 4, y.data(), rows, 0, rows);
    ggml_matmul(tc.type, w.data(), 1024, x.data(), 3, y.data(), rows, 0, rows / 4);
    t_counting = false;
    reserved = t_allocs;
  }).join();
  EXPECT_GT(fresh, 0) << "the counter sees the first call's scratch";
  EXPECT_EQ(reserved, 0);
}

}  // namespace
