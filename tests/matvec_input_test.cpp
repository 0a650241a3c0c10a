// kernels/cpu/matvec_input.h: an input rounded once gives, for every type and row range, the bits
// quant_matvec gives on the float vector (which rounds it on every call), reads the row it is
// asked for (a changed block changes that row's result and no other), and refuses to serve a type
// of another kind or width.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_legacy_kernels.h"
#include "kernels/cpu/matvec_input.h"
#include "kernels/cpu/quant.h"

namespace moestream {
namespace {

// A type, and the byte offsets of the float16 factors in one of its blocks (ggml types) that a
// random matrix must keep finite; the pack types are quantised from floats instead.
struct Case {
  QuantType q;
  std::vector<size_t> f16_at;
  bool e8m0 = false;  // MXFP4: byte 0 is an exponent
};

std::vector<Case> cases() {
  auto g = [](GgmlType t) { return ggml_quant(t); };
  return {
      {QuantType::kF32, {}},          {QuantType::kBF16, {}},           {QuantType::kQ8, {}},
      {QuantType::kQ4, {}},           {g(GgmlType::kF32), {}},          {g(GgmlType::kF16), {}},
      {g(GgmlType::kBF16), {}},       {g(GgmlType::kQ8_0), {0}},        {g(GgmlType::kQ4_0), {0}},
      {g(GgmlType::kQ4_1), {0, 2}},   {g(GgmlType::kQ5_0), {0}},        {g(GgmlType::kQ5_1), {0, 2}},
      {g(GgmlType::kIQ4_NL), {0}},    {g(GgmlType::kMXFP4), {}, true},  {g(GgmlType::kQ4_K), {0, 2}},
      {g(GgmlType::kQ6_K), {208}},    {g(GgmlType::kQ2_K), {80, 82}},   {g(GgmlType::kIQ4_XS), {0}},
      {g(GgmlType::kNVFP4), {}},  // every scale byte is finite
  };
}

std::vector<float> normal(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// rows x cols of type c.q with finite factors.
std::vector<uint8_t> random_matrix(const Case& c, size_t rows, size_t cols, std::mt19937& rng) {
  const size_t bytes = quant_matrix_bytes(c.q, rows, cols);
  std::vector<uint8_t> w(bytes);
  const auto g = quant_ggml_type(c.q);
  if (!g || *g == GgmlType::kF32 || *g == GgmlType::kF16 || *g == GgmlType::kBF16) {
    const std::vector<float> f = normal(rows * cols, rng);
    if (!g) {
      quantize_matrix(c.q, f.data(), rows, cols, w.data());
    } else {
      for (size_t i = 0; i < rows * cols; ++i) {
        if (*g == GgmlType::kF32) std::memcpy(&w[4 * i], &f[i], 4);
        const uint16_t h = *g == GgmlType::kF16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
        if (*g != GgmlType::kF32) std::memcpy(&w[2 * i], &h, 2);
      }
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const size_t block = ggml_type_info(uint32_t(*g))->block_bytes;
  std::uniform_real_distribution<float> mag(1.0f / 4096, 1.0f / 16);
  for (size_t off = 0; off < bytes; off += block) {
    if (c.e8m0) w[off] = static_cast<uint8_t>(118 + rng() % 8);
    for (size_t f : c.f16_at) {
      const uint16_t h = f32_to_f16((rng() & 1) ? mag(rng) : -mag(rng));
      std::memcpy(&w[off + f], &h, 2);
    }
  }
  return w;
}

// Widths: several 256-blocks for the K types, odd block counts for the 32-element ones (the
// AVX2 kernels take 8 blocks per group and pairs of blocks), and an odd width for the pack's
// float types.
std::vector<size_t> widths(QuantType q) {
  switch (matvec_input_kind(q)) {
    case MatvecInputKind::kGgmlSuper: return {256, 768};
    case MatvecInputKind::kFloat: return quant_ggml_type(q) ? std::vector<size_t>{96, 2048} : std::vector<size_t>{37, 2048};
    default: return quant_ggml_type(q) == GgmlType::kNVFP4 ? std::vector<size_t>{64, 384, 2048}
                                                           : std::vector<size_t>{32, 352, 2048};
  }
}

TEST(MatvecInput, EqualsTheFloatProductBitForBitOnEveryRowRange) {
  std::mt19937 rng(7);
  MatvecInput in;
  for (const Case& c : cases()) {
    for (size_t cols : widths(c.q)) {
      const size_t rows = 37;
      const std::string where = std::string(quant_name(c.q)) + " " + std::to_string(cols) + " columns";
      const std::vector<uint8_t> w = random_matrix(c, rows, cols, rng);
      const std::vector<float> x = normal(cols, rng);
      in.round(c.q, x.data(), cols);
      ASSERT_TRUE(in.serves(c.q, cols)) << where;
      for (auto [r0, r1] : {std::pair<size_t, size_t>{0, rows}, {5, 6}, {3, 30}}) {
        constexpr float kSentinel = -12345.0f;
        std::vector<float> want(rows, kSentinel), got(rows, kSentinel);
        quant_matvec(c.q, w.data(), cols, x.data(), want.data(), r0, r1);
        quant_matvec(c.q, w.data(), cols, in, got.data(), r0, r1);
        for (size_t r = 0; r < rows; ++r) {
          if (r < r0 || r >= r1) {
            EXPECT_EQ(got[r], kSentinel) << where << " row " << r << " outside [" << r0 << ", " << r1 << ")";
            continue;
          }
          EXPECT_EQ(std::memcmp(&got[r], &want[r], 4), 0) << where << " row " << r << ": " << got[r] << " vs " << want[r];
        }
      }
    }
  }
}

// A wrong row or block would pass the comparison above only if both paths read it; here one
// block of row 4 changes and exactly that row's result must move (the rounded input is reused).
TEST(MatvecInput, AChangedBlockMovesOnlyItsRow) {
  std::mt19937 rng(11);
  MatvecInput in;
  for (const Case& c : cases()) {
    const size_t rows = 9, cols = quant_ggml_type(c.q) ? 768 : 64;
    std::vector<uint8_t> w = random_matrix(c, rows, cols, rng);
    const std::vector<float> x = normal(cols, rng);
    in.round(c.q, x.data(), cols);
    std::vector<float> before(rows), after(rows);
    quant_matvec(c.q, w.data(), cols, in, before.data(), 0, rows);
    const size_t row_bytes = quant_matrix_bytes(c.q, 1, cols);
    // The last bytes of row 4: quant bits in every type's layout except Q6_K's (its scale is
    // last), whose quant bits start the block.
    const bool q6k = quant_ggml_type(c.q) == GgmlType::kQ6_K;
    const size_t at = 4 * row_bytes + (q6k ? 0 : row_bytes - 4);
    for (size_t i = 0; i < 4; ++i) w[at + i] ^= 0x5a;
    quant_matvec(c.q, w.data(), cols, in, after.data(), 0, rows);
    for (size_t r = 0; r < rows; ++r) {
      if (r == 4) EXPECT_NE(after[r], before[r]) << quant_name(c.q) << ": the changed row did not move";
      else EXPECT_EQ(std::memcmp(&after[r], &before[r], 4), 0) << quant_name(c.q) << " row " << r << " moved";
    }
  }
}

// Both table entries of the 32-element block types (scalar and AVX2) against the matvec of the
// same family on the float input, on an input that is not the first of the rounded ones.
TEST(MatvecInput, RoundedKernelsOfTheTableEqualTheirMatvec) {
  std::mt19937 rng(5);
  for (const Case& c : cases()) {
    if (matvec_input_kind(c.q) != MatvecInputKind::kGgmlBlocks) continue;
    const GgmlType t = *quant_ggml_type(c.q);
    const detail::GgmlKernels& k = *detail::ggml_legacy_kernels(t);
    const size_t rows = 11, cols = t == GgmlType::kNVFP4 ? 384 : 352;
    const std::vector<uint8_t> w = random_matrix(c, rows, cols, rng);
    const std::vector<float> x = normal(3 * cols, rng);
    detail::GgmlActivationBuffers b;
    const detail::GgmlActivations a = detail::ggml_round_activations_into(b, x.data(), cols, 3, false);
    std::vector<float> want(rows), got(rows);
    k.matvec_scalar(w.data(), cols, x.data() + 2 * cols, want.data(), 0, rows);
    k.rounded_matvec_scalar(w.data(), a, 2, got.data(), 0, rows);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), rows * 4), 0) << quant_name(c.q) << " scalar";
    if (k.rounded_matvec_avx2 == nullptr || !quant_simd_available()) continue;
    k.matvec_avx2(w.data(), cols, x.data() + 2 * cols, want.data(), 0, rows);
    k.rounded_matvec_avx2(w.data(), a, 2, got.data(), 0, rows);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), rows * 4), 0) << quant_name(c.q) << " avx2";
  }
}

TEST(MatvecInput, ServesOnlyTheKindAndWidthItWasRoundedFor) {
  std::mt19937 rng(3);
  const std::vector<float> x = normal(512, rng);
  MatvecInput in;
  EXPECT_FALSE(in.serves(QuantType::kF32, 512)) << "nothing rounded yet";
  in.round(ggml_quant(GgmlType::kQ8_0), x.data(), 512);
  EXPECT_TRUE(in.serves(ggml_quant(GgmlType::kQ4_0), 512)) << "the 32-element block types round alike";
  EXPECT_FALSE(in.serves(ggml_quant(GgmlType::kQ8_0), 256)) << "another width";
  EXPECT_FALSE(in.serves(QuantType::kQ8, 512)) << "the pack's q8 keeps float32 scales";
  EXPECT_FALSE(in.serves(ggml_quant(GgmlType::kQ4_K), 512));
  EXPECT_FALSE(in.serves(QuantType::kBF16, 512));
  EXPECT_THROW(matvec_input_kind(ggml_quant(GgmlType::kQ8_1)), ConfigError);
  in.round(QuantType::kBF16, x.data(), 512);
  EXPECT_TRUE(in.serves(ggml_quant(GgmlType::kF16), 512)) << "float inputs serve every float type";
}

}  // namespace
}  // namespace moestream
