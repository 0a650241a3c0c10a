// FP8 checkpoints (runtime/convert/fp8_weights.h, HfCheckpoint's FP8 reads) against torch's own
// float8_e4m3fn dequantisation, stored next to the weights in tests/fixtures/fp8 by
// python/training/make_fixtures.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/safetensors.h"
#include "runtime/convert/fp8_weights.h"
#include "runtime/convert/hf_checkpoint.h"

namespace moestream {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/fp8";

void expect_same_as_reference(const HfCheckpoint& ck, const std::string& name) {
  const TensorInfo& info = ck.info(name + ".weight");
  ASSERT_EQ(info.dtype, DType::kF8E4M3);
  const std::vector<float> got = ck.read(name + ".weight", info.shape);
  const std::vector<float> want = ck.read(name + ".reference", info.shape);
  ASSERT_EQ(got.size(), want.size());
  size_t nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << name << " element " << i;
      continue;
    }
    // Both are one float multiply of the same exact operands: bit-identical.
    EXPECT_EQ(got[i], want[i]) << name << " element " << i;
    nonzero += want[i] != 0;
  }
  EXPECT_GT(nonzero, got.size() / 2);
}

TEST(Fp8Weights, BlockScaledMatrixMatchesTorch) {
  HfCheckpoint ck(kFixture);
  expect_same_as_reference(ck, "odd");  // 130 x 260: partial blocks on both edges
}

TEST(Fp8Weights, EveryCodeMatchesTorch) {
  HfCheckpoint ck(kFixture);
  expect_same_as_reference(ck, "codes");
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);  // the largest finite value
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x80), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
}

TEST(Fp8Weights, RowRangeReadsTheSameRows) {
  HfCheckpoint ck(kFixture);
  const std::vector<float> all = ck.read("odd.weight", {130, 260});
  std::vector<float> part(size_t(3) * 260);
  ck.read_float("odd.weight", 127 * 260, part.size(), part.data());  // straddles a block edge
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], all[127 * 260 + i]);
}

TEST(Fp8Weights, WrongBlockSizeIsAFormatError) {
  HfCheckpoint ck(kFixture);
  ck.set_fp8_block({64, 64});  // the scales are [2, 3], 64 x 64 blocks would need [3, 5]
  try {
    (void)ck.read("odd.weight", {130, 260});
    FAIL() << "expected a FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("odd.weight_scale_inv"), std::string::npos) << e.what();
  }
}

// A checkpoint of one FP8 matrix [2, 3] whose scale tensor is `scale` (absent when empty).
std::filesystem::path write_fp8_checkpoint(const TempDir& d, const std::vector<float>& scale) {
  SafetensorsWriter w(d.path() / "model.safetensors");
  w.declare("w.weight", DType::kF8E4M3, {2, 3});
  if (!scale.empty()) w.declare("w.weight_scale_inv", DType::kF32, {1, 1});
  const uint8_t bytes[6] = {0x38, 0x40, 0xb8, 0x00, 0x7e, 0x01};  // 1, 2, -1, 0, 448, 2^-9
  w.write_raw("w.weight", bytes, sizeof bytes);
  if (!scale.empty()) w.write("w.weight_scale_inv", scale.data(), scale.size());
  w.finish();
  return d.path();
}

TEST(Fp8Weights, ScalesThatAreMissingOrNotFiniteAreFormatErrors) {
  {
    TempDir d("fp8");
    HfCheckpoint ck(write_fp8_checkpoint(d, {0.5f}));
    const std::vector<float> v = ck.read("w.weight", {2, 3});
    EXPECT_EQ(v, (std::vector<float>{0.5f, 1.0f, -0.5f, 0.0f, 224.0f, std::ldexp(1.0f, -10)}));
  }
  for (const std::vector<float>& scale : {std::vector<float>{}, std::vector<float>{NAN}}) {
    TempDir d("fp8");
    HfCheckpoint ck(write_fp8_checkpoint(d, scale));
    try {
      (void)ck.read("w.weight", {2, 3});
      FAIL() << "expected a FormatError";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("w.weight_scale_inv"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace moestream
