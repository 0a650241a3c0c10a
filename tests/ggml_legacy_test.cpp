// The legacy ggml family (kernels/cpu/ggml_legacy*.cpp): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, IQ4_NL, MXFP4, and NVFP4 (ggml_nvfp4*.cpp: 64-element blocks on the family's int8 inputs).
// Dequantisation is checked bit for bit against the gguf package in
// tests/python/test_ggml_legacy.py; here: known blocks decoded by hand, and the products against
// float64 dot products over the dequantised weights, scalar against AVX2, matmul against matvec.
//
// Tolerances (docs/format.md, "ggml block types"):
// - order: any summation order of the f32 kernels is within (nb + 16) * 2^-23 * mag of the exact
//   sum over the same terms (nb = blocks per row, NVFP4's sub-blocks of 16, or cols for the plain
//   types), where mag is
//   sum_c (|w_c| + 2 |c_b|) * |x_c|, c_b the offset the AVX2 kernel splits off a block (the min
//   of Q4_1/Q5_1, 8d, 16d, 12d for Q4_0, Q5_0, MXFP4, else 0). Checked against the float64 dot
//   with the int8-rounded input, which both kernels multiply.
// - activation rounding (block types): the int8 input moves each element by at most d_x/2 =
//   amax/254 of its block, so y moves by at most sum_c |w_c| * amax_b / 254 (plus the order term).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/ggml_kernels.h"
#include "loader/format/ggml_nvfp4.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant_kernels.h"
#include "tests/support/random_blocks.h"

namespace moestream {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,   GgmlType::kQ4_1,
                               GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4,
                               GgmlType::kNVFP4};

GgmlTypeInfo info_of(GgmlType t) { return *ggml_type_info(static_cast<uint32_t>(t)); }
std::string name_of(GgmlType t) { return std::string(ggml_type_name(t)); }

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Random rows x cols of type t: N(0,1) floats for the plain types; random level bytes with finite
// float16 scales of either sign (and mins) for the block types, E8M0 around 2^-7 for MXFP4. Q8_0
// bytes include -128, which the format allows.
std::vector<uint8_t> random_matrix(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  const GgmlTypeInfo info = info_of(t);
  const size_t bytes = *ggml_row_bytes(t, cols) * rows;
  std::vector<uint8_t> m(bytes);
  if (info.block_elems == 1) {
    test::fill_random_floats(t, m.data(), rows * cols, 1.0f, rng);
    return m;
  }
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& b : m) b = static_cast<uint8_t>(rng());
  for (size_t off = 0; off < bytes; off += info.block_bytes) {
    if (t == GgmlType::kMXFP4) {
      m[off] = static_cast<uint8_t>(118 + rng() % 8);
      continue;
    }
    if (t == GgmlType::kNVFP4) {  // UE4M3 scales 2^-4..2^2 (exponent bits 3..9), any mantissa
      for (size_t s = 0; s < 4; ++s) m[off + s] = static_cast<uint8_t>((3 + rng() % 7) << 3 | (rng() & 7));
      continue;
    }
    put_f16(&m[off], 0.01f * g(rng));
    if (t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1) put_f16(&m[off + 2], 0.1f * g(rng));
  }
  return m;
}

// |c_b| of the block at p (see the file comment).
double offset_magnitude(GgmlType t, const uint8_t* p) {
  switch (t) {
    case GgmlType::kQ4_0: return 8 * std::fabs(f16_at(p));
    case GgmlType::kQ5_0: return 16 * std::fabs(f16_at(p));
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return std::fabs(f16_at(p + 2));
    case GgmlType::kMXFP4: return 12 * std::ldexp(1.0, int{p[0]} - 128);
    default: return 0;
  }
}

// One input x against the dequantised matrix, in float64.
struct Reference {
  std::vector<double> exact;    // W . x
  std::vector<double> rounded;  // W . x^ (the int8-rounded input; = exact for the plain types)
  std::vector<double> tol_order;
  std::vector<double> tol_act;  // the activation rounding bound (0 for the plain types)
};

Reference reference(GgmlType t, const std::vector<uint8_t>& w, size_t rows, size_t cols, const float* x) {
  const GgmlTypeInfo info = info_of(t);
  const bool blocks = info.block_elems > 1;
  // Terms each output sums: one per block, per NVFP4 sub-block of 16, per column.
  const size_t nb = t == GgmlType::kNVFP4 ? cols / 16 : blocks ? cols / 32 : cols;
  const size_t row_bytes = *ggml_row_bytes(t, cols);
  std::vector<double> xr(x, x + cols), step(cols, 0.0);
  if (blocks) {  // the kernels' rounding of x (quantize_activations, tested in quant_test), with
                 // the block scale then rounded to float16 as llama.cpp's q8_0 activations carry it
    std::vector<float> d(nb), sum8(nb);
    std::vector<int8_t> q(cols), pairs(cols);
    std::vector<uint8_t> aq(cols);
    detail::quantize_activations(x, cols, d.data(), q.data(), aq.data(), sum8.data(), pairs.data());
    for (size_t c = 0; c < cols; ++c) {
      const float d16 = f16_to_f32(f32_to_f16(d[c / 32]));
      xr[c] = double(q[c]) * d16;
      // amax / 254 from the int8 rounding, plus 127 |d - d16| from the scale's
      step[c] = double(d[c / 32]) * 127 / 254 + 127 * std::fabs(double(d[c / 32]) - double(d16));
    }
  }
  Reference ref;
  std::vector<float> wd(cols);
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.data() + r * row_bytes;
    ggml_dequantize_row(t, row, cols, wd.data());
    double ex = 0, rd = 0, mag = 0, act = 0;
    for (size_t c = 0; c < cols; ++c) {
      const double off = info.block_elems == 32 ? offset_magnitude(t, row + (c / 32) * info.block_bytes) : 0.0;
      ex += double(wd[c]) * x[c];
      rd += double(wd[c]) * xr[c];
      mag += (std::fabs(wd[c]) + 2 * off) * std::fabs(xr[c]);
      act += std::fabs(wd[c]) * (step[c] * (1 + 1e-5) + std::fabs(x[c]) * 0x1p-20);
    }
    ref.exact.push_back(ex);
    ref.rounded.push_back(rd);
    // The floor covers float32 subnormal results (MXFP4 with tiny exponents): one ulp per step.
    ref.tol_order.push_back((double(nb) + 16) * (0x1p-23 * mag + 0x1p-148));
    ref.tol_act.push_back(act);
  }
  return ref;
}

std::vector<float> random_input(size_t cols, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(cols * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = g(rng) * (i % 61 == 7 ? 20.0f : 1.0f);  // outlier channels
  return x;
}

struct Shape {
  size_t rows, cols;
};

std::vector<Shape> shapes_for(GgmlType t) {
  if (info_of(t).block_elems == 1) return {{5, 1}, {9, 7}, {13, 37}, {6, 256}, {11, 1000}};
  if (t == GgmlType::kNVFP4) return {{1, 64}, {7, 64}, {5, 128}, {9, 192}, {6, 320}, {13, 1216}, {4, 2048}};
  return {{1, 32}, {7, 32}, {5, 64}, {9, 96}, {6, 224}, {13, 1184}, {4, 2048}};
}

TEST(GgmlLegacy, EveryTypeOfTheFamilyIsComputable) {
  for (GgmlType t : kTypes) {
    EXPECT_TRUE(ggml_type_computable(t)) << name_of(t);
    ASSERT_NE(detail::ggml_legacy_kernels(t), nullptr) << name_of(t);
  }
  EXPECT_EQ(detail::ggml_legacy_kernels(GgmlType::kQ4_K), nullptr);  // the k-quant family's
  EXPECT_EQ(detail::ggml_legacy_kernels(GgmlType::kQ8_1), nullptr);  // no kernel: refused
}

TEST(GgmlLegacy, DequantizesHandBuiltBlocks) {
  std::vector<float> out(32);
  {  // Q4_1: d = 0.5, m = -1, byte j = (15 - j%16) << 4 | j%16: element j = 0.5 * (j%16) - 1, j+16 = 0.5 * (15-j) - 1
    uint8_t b[20];
    put_f16(b, 0.5f);
    put_f16(b + 2, -1.0f);
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(((15 - j) << 4) | j);
    ggml_dequantize_row(GgmlType::kQ4_1, b, 32, out.data());
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(out[j], 0.5f * j - 1) << j;
      EXPECT_EQ(out[16 + j], 0.5f * (15 - j) - 1) << j;
    }
  }
  {  // Q5_0: d = 2, low nibbles 0, qh bit j set for odd j: element j = 2 * ((j odd ? 16 : 0) - 16)
    uint8_t b[22] = {};
    put_f16(b, 2.0f);
    const uint32_t qh = 0xaaaaaaaau;
    std::memcpy(b + 2, &qh, 4);
    ggml_dequantize_row(GgmlType::kQ5_0, b, 32, out.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], j % 2 ? 0.0f : -32.0f) << j;
  }
  {  // MXFP4: e = 128 (scale 2), nibble j%16 in both halves: element = 2 * E2M1[j%16]
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    uint8_t b[17];
    b[0] = 128;
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j << 4 | j);
    ggml_dequantize_row(GgmlType::kMXFP4, b, 32, out.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2 * e2m1[j % 16]) << j;
  }
  {  // NVFP4, from the format's definition: UE4M3 scale per 16 elements (exponent bits 3-6, bias
     // 7; e = 0 subnormal m/8 * 2^-6; 0x7F is NaN, which gguf.quants decodes as 0), E2M1 levels.
     // Scales 0x38 = 1, 0x01 = 2^-9, 0x7F, 0xCC = 1.5 * 2^2 (bit 7 unused); nibble = j % 16.
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    const float scale[4] = {1.0f, 0x1p-9f, 0.0f, 6.0f};
    uint8_t b[36] = {0x38, 0x01, 0x7f, 0xcc};
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 8; ++j) b[4 + 8 * s + j] = static_cast<uint8_t>((8 + j) << 4 | j);
    std::vector<float> out64(64);
    ggml_dequantize_row(GgmlType::kNVFP4, b, 64, out64.data());
    for (int j = 0; j < 64; ++j) EXPECT_EQ(out64[j], scale[j / 16] * e2m1[j % 16]) << j;
  }
  {  // IQ4_NL: d = -1, nibble j%16: element = -table[j%16]
    const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    uint8_t b[18];
    put_f16(b, -1.0f);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j << 4 | j);
    ggml_dequantize_row(GgmlType::kIQ4_NL, b, 32, out.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], float(-table[j % 16])) << j;
  }
}

// Both kernels of every type, on every shape: within the order tolerance of the float64 product
// with the rounded input, within the activation bound of the exact one, and each other.
TEST(GgmlLegacy, MatvecIsWithinToleranceOfFloat64) {
  std::mt19937 rng(7);
  for (GgmlType t : kTypes) {
    const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(t);
    for (const Shape& s : shapes_for(t)) {
      const std::vector<uint8_t> w = random_matrix(t, s.rows, s.cols, rng);
      const std::vector<float> x = random_input(s.cols, 1, rng);
      const Reference ref = reference(t, w, s.rows, s.cols, x.data());
      std::vector<float> ys(s.rows), ya(s.rows);
      k.matvec_scalar(w.data(), s.cols, x.data(), ys.data(), 0, s.rows);
      const bool avx2 = k.matvec_avx2 != nullptr && detail::avx2_usable();
      if (avx2) k.matvec_avx2(w.data(), s.cols, x.data(), ya.data(), 0, s.rows);
      for (size_t r = 0; r < s.rows; ++r) {
        const std::string where = name_of(t) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                  " row " + std::to_string(r);
        EXPECT_NEAR(ys[r], ref.rounded[r], ref.tol_order[r]) << where << " scalar";
        EXPECT_NEAR(ys[r], ref.exact[r], ref.tol_act[r] + ref.tol_order[r]) << where << " scalar";
        if (!avx2) continue;
        EXPECT_NEAR(ya[r], ref.rounded[r], ref.tol_order[r]) << where << " avx2";
        EXPECT_NEAR(ya[r], ys[r], 2 * ref.tol_order[r]) << where << " avx2 vs scalar";
      }
    }
  }
  if (!detail::avx2_usable()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU (or not compiled in): scalar only";
}

// Edge encodings: MXFP4 exponents across E8M0 (0 and 1 are float32 subnormals, the AVX2 kernel
// builds them another way than the normal ones), and Q8_0 levels of -128 (no int8 negation).
TEST(GgmlLegacy, ExtremeScalesAndLevels) {
  std::mt19937 rng(13);
  const size_t cols = 256, nb = cols / 32;
  const uint8_t exponents[] = {0, 1, 2, 3, 100, 127, 128, 129, 200, 230};
  std::vector<uint8_t> mx = random_matrix(GgmlType::kMXFP4, std::size(exponents), cols, rng);
  for (size_t r = 0; r < std::size(exponents); ++r)
    for (size_t b = 0; b < nb; ++b) mx[(r * nb + b) * 17] = exponents[r];
  std::vector<uint8_t> q8 = random_matrix(GgmlType::kQ8_0, 3, cols, rng);
  for (size_t b = 0; b < 3 * nb; b += 2) std::memset(&q8[b * 34 + 2], 0x80, 32);  // every other block all -128
  const std::vector<float> x = random_input(cols, 1, rng);
  for (const auto& [t, w, rows] : {std::tuple{GgmlType::kMXFP4, &mx, std::size(exponents)},
                                   std::tuple{GgmlType::kQ8_0, &q8, size_t{3}}}) {
    const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(t);
    const Reference ref = reference(t, *w, rows, cols, x.data());
    std::vector<float> ys(rows), ya(rows);
    k.matvec_scalar(w->data(), cols, x.data(), ys.data(), 0, rows);
    const bool avx2 = k.matvec_avx2 != nullptr && detail::avx2_usable();
    if (avx2) k.matvec_avx2(w->data(), cols, x.data(), ya.data(), 0, rows);
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(std::isfinite(ref.rounded[r]));
      EXPECT_NEAR(ys[r], ref.rounded[r], ref.tol_order[r]) << name_of(t) << " row " << r << " scalar";
      if (avx2) {
        EXPECT_NEAR(ya[r], ref.rounded[r], ref.tol_order[r]) << name_of(t) << " row " << r << " avx2";
      }
    }
  }
}

// The order tolerance must not be so loose that a wrong block passes: changing the levels of the
// block with the largest scale moves the result past it.
TEST(GgmlLegacy, OrderToleranceCatchesOneWrongLevel) {
  std::mt19937 rng(3);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4,
                     GgmlType::kNVFP4}) {
    const size_t cols = 256;
    std::vector<uint8_t> w = random_matrix(t, 1, cols, rng);
    const std::vector<float> x = random_input(cols, 1, rng);
    const Reference ref = reference(t, w, 1, cols, x.data());
    const size_t bb = info_of(t).block_bytes;
    size_t big = 0;
    auto scale = [&](size_t b) {  // NVFP4: the smaller scale of sub-blocks 2 and 3 (changed below)
      if (t == GgmlType::kNVFP4) return double(std::min(detail::kNvfp4HalfScales.v[w[b * bb + 2]],
                                                        detail::kNvfp4HalfScales.v[w[b * bb + 3]]));
      return t == GgmlType::kMXFP4 ? std::ldexp(1.0, int{w[b * bb]} - 128) : std::fabs(f16_at(&w[b * bb]));
    };
    for (size_t b = 0; b < cols / info_of(t).block_elems; ++b)
      if (scale(b) > scale(big)) big = b;
    for (size_t j = bb - 16; j < bb; ++j) w[big * bb + j] ^= 0x77;
    float y = 0;
    ggml_matvec(t, w.data(), cols, x.data(), &y, 0, 1);
    EXPECT_GT(std::fabs(y - ref.rounded[0]), 2 * ref.tol_order[0]) << name_of(t);
  }
}

// matmul over n inputs equals matvec input by input, bit for bit, for both kernels, on odd row
// ranges, writing only its rows of y (y_stride > rows).
TEST(GgmlLegacy, MatmulEqualsMatvecInputByInput) {
  std::mt19937 rng(11);
  const float kSentinel = -12345.0f;
  for (GgmlType t : kTypes) {
    const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(t);
    const bool blocks = info_of(t).block_elems > 1;
    const std::vector<size_t> widths = t == GgmlType::kNVFP4 ? std::vector<size_t>{64, 320, 2048}
                                       : blocks                ? std::vector<size_t>{32, 288, 2048}
                                                               : std::vector<size_t>{3, 40, 1001};
    for (size_t cols : widths) {
      const size_t rows = 11, stride = 13, row_begin = 3, row_end = 10;
      const std::vector<uint8_t> w = random_matrix(t, rows, cols, rng);
      for (size_t n : {1, 2, 3, 4, 5, 9}) {
        const std::vector<float> x = random_input(cols, n, rng);
        for (int avx2 = 0; avx2 < 2; ++avx2) {
          if (avx2 && (k.matvec_avx2 == nullptr || !detail::avx2_usable())) continue;
          const auto mv = avx2 ? k.matvec_avx2 : k.matvec_scalar;
          const auto mm = avx2 ? k.matmul_avx2 : k.matmul_scalar;
          std::vector<float> y(n * stride, kSentinel);
          mm(w.data(), cols, x.data(), n, y.data(), stride, row_begin, row_end);
          for (size_t i = 0; i < n; ++i) {
            std::vector<float> yv(rows, kSentinel);
            mv(w.data(), cols, x.data() + i * cols, yv.data(), row_begin, row_end);
            for (size_t r = 0; r < stride; ++r) {
              const std::string where = name_of(t) + (avx2 ? " avx2" : " scalar") + " cols " + std::to_string(cols) +
                                        " n " + std::to_string(n) + " input " + std::to_string(i) + " row " +
                                        std::to_string(r);
              const float got = y[i * stride + r];
              if (r < row_begin || r >= row_end) {
                EXPECT_EQ(got, kSentinel) << where << ": outside the row range";
                if (r < rows) {
                  EXPECT_EQ(yv[r], kSentinel) << where << ": matvec outside the row range";
                }
                continue;
              }
              EXPECT_EQ(std::memcmp(&got, &yv[r], 4), 0) << where << ": " << got << " vs " << yv[r];
            }
          }
        }
      }
    }
  }
}

// The public entry points dispatch to the AVX2 kernels where the CPU has them.
TEST(GgmlLegacy, PublicEntryPointsUseTheChosenKernel) {
  std::mt19937 rng(5);
  for (GgmlType t : kTypes) {
    const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(t);
    const size_t rows = 9, cols = 256;
    const std::vector<uint8_t> w = random_matrix(t, rows, cols, rng);
    const std::vector<float> x = random_input(cols, 3, rng);
    const bool avx2 = k.matvec_avx2 != nullptr && detail::avx2_usable();
    std::vector<float> a(rows), b(rows), c(3 * rows), d(3 * rows);
    ggml_matvec(t, w.data(), cols, x.data(), a.data(), 0, rows);
    (avx2 ? k.matvec_avx2 : k.matvec_scalar)(w.data(), cols, x.data(), b.data(), 0, rows);
    ggml_matmul(t, w.data(), cols, x.data(), 3, c.data(), rows, 0, rows);
    (avx2 ? k.matmul_avx2 : k.matmul_scalar)(w.data(), cols, x.data(), 3, d.data(), rows, 0, rows);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), rows * 4), 0) << name_of(t);
    EXPECT_EQ(std::memcmp(c.data(), d.data(), 3 * rows * 4), 0) << name_of(t);
  }
}

// Scratch sized by ggml_reserve_scratch serves narrower and then wider calls (it grows).
TEST(GgmlLegacy, ScratchServesCallsOfAnyWidth) {
  std::mt19937 rng(9);
  ggml_reserve_scratch(64, 1);
  for (size_t cols : {2048, 32, 4096, 96}) {
    const std::vector<uint8_t> w = random_matrix(GgmlType::kQ4_0, 3, cols, rng);
    const std::vector<float> x = random_input(cols, 6, rng);
    const Reference ref = reference(GgmlType::kQ4_0, w, 3, cols, x.data() + 5 * cols);
    std::vector<float> y(6 * 3);
    ggml_matmul(GgmlType::kQ4_0, w.data(), cols, x.data(), 6, y.data(), 3, 0, 3);
    for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(y[5 * 3 + r], ref.rounded[r], ref.tol_order[r]) << cols;
  }
}

}  // namespace
}  // namespace moestream
