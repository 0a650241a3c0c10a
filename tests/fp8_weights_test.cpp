// FP8 checkpoints (runtime/convert/fp8_weights.h, HfCheckpoint's FP8 reads) against torch's own
// float8_e4m3fn dequantisation, stored next to the weights in tests/fixtures/fp8 by
// python/training/make_fixtures.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
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

}  // namespace
}  // namespace moestream
