// Tests of kernels/cpu/quant.h and common/half.h: fp16/bf16 conversions, quantisation round-trip
// error bounds, and the matvec kernels (AVX2 against the scalar reference, both against exact
// float maths) on odd sizes with random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace moestream;

namespace {

constexpr QuantType kAllQuants[] = {QuantType::kF32, QuantType::kBF16, QuantType::kQ8, QuantType::kQ4};

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  // A few outliers, as real weights have: they stress per-block scales.
  for (size_t i = 0; i < n; i += 97) v[i] *= 8.0f;
  return v;
}

std::vector<uint8_t> encode(QuantType q, const std::vector<float>& w, size_t rows, size_t cols) {
  std::vector<uint8_t> enc(quant_matrix_bytes(q, rows, cols));
  quantize_matrix(q, w.data(), rows, cols, enc.data());
  return enc;
}

// Widths around the 32-wide quant block: partial, exact, one over, several blocks.
constexpr size_t kBlockEdgeCols[] = {1, 31, 32, 33, 67, 256};
constexpr size_t kRoundTripRows = 7;

struct RoundTrip {
  std::vector<float> w;      // the weights, kRoundTripRows x cols, small as real weights are
  std::vector<uint8_t> enc;  // quantised
  std::vector<float> back;   // dequantised again
};
RoundTrip round_trip(QuantType q, size_t cols, uint32_t seed) {
  RoundTrip t{random_vec(kRoundTripRows * cols, seed, 0.02f), {}, std::vector<float>(kRoundTripRows * cols)};
  t.enc = encode(q, t.w, kRoundTripRows, cols);
  dequantize_matrix(q, t.enc.data(), kRoundTripRows, cols, t.back.data());
  return t;
}

float stored_scale(const std::vector<uint8_t>& enc, QuantType q, size_t cols, size_t r, size_t b) {
  const uint8_t* p = enc.data() + r * quant_matrix_bytes(q, 1, cols) + 2 * b;
  return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

}  // namespace

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

TEST(Half, MatchesF16cHardwareBitForBit) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU lacks F16C: no hardware oracle";
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = f16_to_f32(static_cast<uint16_t>(h)), b = hw_f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
      continue;
    }
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "half " << h;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = bits(rng);
    // Bias toward the half range (exponents around 2^-26..2^17) to hit subnormals and overflow.
    if (i % 2) u = (u & 0x807fffffu) | ((96u + (u >> 23) % 50u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << "float bits " << std::hex << u;
  }
}
#endif

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float up;  // 1 + 2^-8 + 2^-16: just above half way, rounds up
  uint32_t u = 0x3f808001u;
  std::memcpy(&up, &u, 4);
  EXPECT_EQ(f32_to_bf16(up), 0x3f81);
  u = 0x3f808000u;  // exactly half way, even below: stays
  std::memcpy(&up, &u, 4);
  EXPECT_EQ(f32_to_bf16(up), 0x3f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
}

TEST(Quant, F32AndBf16RoundTripExactly) {
  const size_t rows = 5, cols = 37;
  std::vector<float> w = random_vec(rows * cols, 3);
  std::vector<float> back(rows * cols);
  dequantize_matrix(QuantType::kF32, encode(QuantType::kF32, w, rows, cols).data(), rows, cols, back.data());
  EXPECT_EQ(back, w);
  for (auto& x : w) x = bf16_to_f32(f32_to_bf16(x));  // values representable in bf16
  dequantize_matrix(QuantType::kBF16, encode(QuantType::kBF16, w, rows, cols).data(), rows, cols, back.data());
  EXPECT_EQ(back, w);
}

TEST(Quant, Q8ErrorIsAtMostHalfAStepPerBlock) {
  for (size_t cols : kBlockEdgeCols) {
    const size_t rows = kRoundTripRows;
    const auto [w, enc, back] = round_trip(QuantType::kQ8, cols, 10 + cols);
    double sq = 0, sq_ref = 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        float d = stored_scale(enc, QuantType::kQ8, cols, r, c / 32);
        float err = std::fabs(back[r * cols + c] - w[r * cols + c]);
        ASSERT_LE(err, 0.5f * d * 1.001f + 1e-9f) << "cols " << cols << " r " << r << " c " << c;
        sq += err * err;
        sq_ref += double(d) * d / 12;  // round to nearest: uniform error over one step
      }
    EXPECT_LT(sq, 1.5 * sq_ref) << "mean squared error vs d^2/12, cols " << cols;
  }
}

TEST(Quant, Q4ErrorIsBoundedAndBlockExtremeIsExact) {
  for (size_t cols : kBlockEdgeCols) {
    const size_t rows = kRoundTripRows;
    const auto [w, enc, back] = round_trip(QuantType::kQ4, cols, 20 + cols);
    double sq = 0, sq_ref = 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t b = 0; b * 32 < cols; ++b) {
        float d = stored_scale(enc, QuantType::kQ4, cols, r, b);
        size_t arg = b * 32;
        for (size_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
          // Within half a step, except a value of the opposite sign near |m|, which clamps to
          // nibble 15 (+7 steps): at most one full step off.
          float err = std::fabs(back[r * cols + c] - w[r * cols + c]);
          ASSERT_LE(err, std::fabs(d) * 1.001f + 1e-9f) << "cols " << cols;
          sq += err * err;
          sq_ref += double(d) * d / 12;
          if (std::fabs(w[r * cols + c]) > std::fabs(w[r * cols + arg])) arg = c;
        }
        // The largest-magnitude element is nibble 0 (-8 * d): exact up to the fp16 scale.
        EXPECT_NEAR(back[r * cols + arg], w[r * cols + arg], std::fabs(w[r * cols + arg]) * 1e-3);
      }
    EXPECT_LT(sq, 1.5 * sq_ref) << "mean squared error vs d^2/12 (nearest rounding), cols " << cols;
  }
}

TEST(Quant, AllZeroBlocksStayZero) {
  std::vector<float> w(3 * 40, 0.0f);
  for (QuantType q : kAllQuants) {
    std::vector<float> back(w.size(), 1.0f);
    dequantize_matrix(q, encode(q, w, 3, 40).data(), 3, 40, back.data());
    for (float v : back) ASSERT_EQ(v, 0.0f) << quant_name(q);
  }
}

TEST(QuantActivations, Avx2MatchesScalarBitForBitIncludingTies) {
  if (!quant_simd_available()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU (or not compiled in)";
  for (size_t cols : {1, 17, 32, 33, 64, 95, 2048, 2051}) {
    std::vector<float> x = random_vec(cols, 500 + cols);
    if (cols >= 32)  // a block whose scale is exactly 1: x.5 values are ties (even: 0.5->0, 1.5->2)
      for (int i = 0; i < 32; ++i) x[i] = i == 0 ? 127.0f : (i % 2 ? -1.0f : 1.0f) * (i * 0.5f);
    const size_t nb = (cols + 31) / 32;
    std::vector<float> d1(nb), d2(nb), s1(nb), s2(nb);
    std::vector<int8_t> q1(nb * 32), q2(nb * 32), p1(nb / 2 * 64), p2(nb / 2 * 64);
    std::vector<uint8_t> a1(nb * 32), a2(nb * 32);
    detail::quantize_activations(x.data(), cols, d1.data(), q1.data(), a1.data(), s1.data(), p1.data());
    detail::quantize_activations_avx2(x.data(), cols, d2.data(), q2.data(), a2.data(), s2.data(), p2.data());
    EXPECT_EQ(d1, d2) << cols;
    EXPECT_EQ(q1, q2) << cols;
    EXPECT_EQ(a1, a2) << cols;
    EXPECT_EQ(s1, s2) << cols;
    EXPECT_EQ(p1, p2) << cols;
    if (cols >= 32) {
      EXPECT_EQ(q1[1], -0);  // -0.5 -> 0
      EXPECT_EQ(q1[3], -2);  // -1.5 -> -2
      EXPECT_EQ(q1[5], -2);  // -2.5 -> -2
    }
  }
}

// The AVX2 kernels against the scalar ones, given the same quantised x: only float summation
// order differs, so the gap is bounded by a few ulps of sum |w*x|.
TEST(QuantMatvec, Avx2MatchesScalarOnOddSizes) {
  if (!quant_simd_available()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU (or not compiled in)";
  for (size_t cols : {1, 7, 31, 32, 33, 63, 65, 67, 200, 1027}) {
    const size_t rows = 13;
    std::vector<float> w = random_vec(rows * cols, 100 + cols);
    std::vector<float> x = random_vec(cols, 200 + cols);
    const size_t nb = (cols + 31) / 32;
    std::vector<float> xd(nb), xs(nb);
    std::vector<int8_t> xq(nb * 32), xp(nb / 2 * 64);
    std::vector<uint8_t> xa(nb * 32);
    detail::quantize_activations(x.data(), cols, xd.data(), xq.data(), xa.data(), xs.data(), xp.data());
    const detail::QuantizedActivations act{xd.data(), xq.data(), xa.data(), xs.data(), xp.data()};
    for (QuantType q : kAllQuants) {
      auto enc = encode(q, w, rows, cols);
      std::vector<float> ys(rows), yv(rows), deq(rows * cols);
      dequantize_matrix(q, enc.data(), rows, cols, deq.data());
      detail::matvec_scalar(q, enc.data(), cols, x.data(), act, ys.data(), 0, rows);
      detail::matvec_avx2(q, enc.data(), cols, x.data(), act, yv.data(), 0, rows);
      for (size_t r = 0; r < rows; ++r) {
        double mag = 0;
        for (size_t c = 0; c < cols; ++c) mag += std::fabs(deq[r * cols + c] * x[c]);
        EXPECT_NEAR(yv[r], ys[r], 1e-5 * mag + 1e-30)
            << quant_name(q) << " cols " << cols << " row " << r;
      }
    }
  }
}

// quant_matvec against exact (double) maths on the dequantised weights. f32/bf16 read x as is;
// q8/q4 quantise x to int8 per block of 32, which moves each product by at most
// |w| * d_x / 2 with d_x = amax(x block)/127: that is the bound checked.
TEST(QuantMatvec, MatchesExactMathsWithinTheActivationQuantisationBound) {
  for (size_t cols : {5, 33, 67, 300}) {
    const size_t rows = 11;
    std::vector<float> w = random_vec(rows * cols, 300 + cols);
    std::vector<float> x = random_vec(cols, 400 + cols);
    const size_t nb = (cols + 31) / 32;
    std::vector<float> dx(nb, 0.0f);
    for (size_t c = 0; c < cols; ++c) dx[c / 32] = std::max(dx[c / 32], std::fabs(x[c]) / 127.0f);
    for (QuantType q : kAllQuants) {
      auto enc = encode(q, w, rows, cols);
      std::vector<float> deq(rows * cols), y(rows);
      dequantize_matrix(q, enc.data(), rows, cols, deq.data());
      quant_matvec(q, enc.data(), cols, x.data(), y.data(), 0, rows);
      const bool int8_x = q == QuantType::kQ8 || q == QuantType::kQ4;
      for (size_t r = 0; r < rows; ++r) {
        double exact = 0, mag = 0, xbound = 0;
        for (size_t c = 0; c < cols; ++c) {
          exact += double(deq[r * cols + c]) * x[c];
          mag += std::fabs(double(deq[r * cols + c]) * x[c]);
          xbound += std::fabs(deq[r * cols + c]) * 0.5 * dx[c / 32];
        }
        double tol = 1e-5 * mag + (int8_x ? xbound * 1.01 : 0.0);
        EXPECT_NEAR(y[r], exact, tol) << quant_name(q) << " cols " << cols << " row " << r;
      }
    }
  }
}

TEST(QuantMatvec, WritesOnlyTheRequestedRowRange) {
  const size_t rows = 9, cols = 45;
  std::vector<float> w = random_vec(rows * cols, 7), x = random_vec(cols, 8);
  for (QuantType q : kAllQuants) {
    auto enc = encode(q, w, rows, cols);
    std::vector<float> full(rows), part(rows, -12345.0f);
    quant_matvec(q, enc.data(), cols, x.data(), full.data(), 0, rows);
    quant_matvec(q, enc.data(), cols, x.data(), part.data(), 3, 7);
    for (size_t r = 0; r < rows; ++r) {
      if (r >= 3 && r < 7) EXPECT_EQ(part[r], full[r]) << quant_name(q);
      else EXPECT_EQ(part[r], -12345.0f) << quant_name(q);
    }
  }
}
