// GgufModel's cross-checks of the metadata against the tensors (issue 47 item 3), on copies of the
// llama.cpp-made fixtures (tests/fixtures/gguf, tests/fixtures/gguf_hf) with one key changed:
// {arch}.rope.dimension_count by each architecture's rule (whole heads, glm4moe's partial rotary,
// deepseek2's MLA rope width) and {arch}.block_count against the blocks the tensors hold. Every
// fixture as made must still load.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "tests/support/gguf_rewrite.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kFixtures = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";

// One fixture per architecture GgufModel reads, with what the file states.
struct ArchFixture {
  const char* file;      // under tests/fixtures
  const char* arch;      // general.architecture
  uint64_t head_dim;     // the attention tensors' head width
  uint64_t rope;         // its rope.dimension_count (or head_dim when absent)
  uint64_t blocks;       // its block_count, the blocks its tensors hold
};
constexpr ArchFixture kArchs[] = {
    {"gguf/mixtral-tiny-F32.gguf", "llama", 16, 16, 2},    {"gguf/olmoe-tiny-F32.gguf", "olmoe", 16, 16, 2},
    {"gguf/qwen3moe-tiny-F32.gguf", "qwen3moe", 16, 16, 2}, {"gguf_hf/qwen2moe-F32.gguf", "qwen2moe", 12, 12, 3},
    {"gguf_hf/gpt_oss-F32.gguf", "gpt-oss", 16, 16, 3},    {"gguf_hf/glm4moe-F32.gguf", "glm4moe", 16, 8, 4},
    {"gguf_hf/deepseek_v3-F32.gguf", "deepseek2", 18, 8, 3},
};

class GgufModelChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const ArchFixture& a : kArchs)
      if (!fs::exists(kFixtures / a.file)) MOESTREAM_SKIP_OR_FAIL() << kFixtures / a.file << " absent";
  }
  // The FormatError of the fixture with metadata `key` set to the u32 `v` ("<no exception>" when
  // it loads).
  std::string error_with(const ArchFixture& a, const std::string& key, std::optional<uint64_t> v) {
    test::GgufRewrite r;
    r.meta[key] = v ? std::optional<GgufValue>(GgufValue::from_unsigned(GgufValueType::kU32, *v)) : std::nullopt;
    test::rewrite_gguf(kFixtures / a.file, x_, r);
    return test::gguf_load_error(x_);
  }
  TempDir tmp_{"gguf_model_test"};
  const fs::path x_ = tmp_.path() / "x.gguf";
};

TEST_F(GgufModelChecks, EveryFixtureLoadsAsMade) {
  for (const char* dir : {"gguf", "gguf_hf"})
    for (const auto& e : fs::directory_iterator(kFixtures / dir)) {
      if (e.path().extension() != ".gguf") continue;
      SCOPED_TRACE(e.path().string());
      EXPECT_NO_THROW(GgufModel g(e.path()));
    }
  for (const ArchFixture& a : kArchs) {  // and the table above says what they hold
    const GgufModel g(kFixtures / a.file);
    EXPECT_EQ(uint64_t(g.config().head_dim), a.head_dim) << a.file;
    EXPECT_EQ(uint64_t(std::string(a.arch) == "deepseek2" ? g.config().qk_rope_head_dim : g.config().rope_dim()),
              a.rope)
        << a.file;
  }
}

// llama (Mixtral: llama.cpp itself refuses n_rot != the head), qwen3moe, olmoe, qwen2moe and
// gpt-oss rotate whole heads: any other width, odd, 0, larger than the head or half of it, would
// be computed as the whole head anyway.
TEST_F(GgufModelChecks, WholeHeadArchitecturesRefuseAnyOtherRopeWidthNamingBoth) {
  for (const ArchFixture& a : kArchs) {
    if (a.rope != a.head_dim) continue;
    const std::string key = std::string(a.arch) + ".rope.dimension_count";
    for (uint64_t v : {a.head_dim / 2, a.head_dim - 1, a.head_dim + 2, uint64_t{0}}) {
      SCOPED_TRACE(key + " = " + std::to_string(v));
      const std::string msg = error_with(a, key, v);
      EXPECT_NE(msg.find(key + " = " + std::to_string(v)), std::string::npos) << msg;
      EXPECT_NE(msg.find("head width " + std::to_string(a.head_dim)), std::string::npos) << msg;
    }
    EXPECT_EQ(error_with(a, key, a.head_dim), "<no exception>") << key;  // stated as the head: fine
    EXPECT_EQ(error_with(a, key, std::nullopt), "<no exception>") << key;  // absent: the head
  }
}

// glm4moe rotates the first rope.dimension_count elements of each head (GLM-4.5: 64 of 128): any
// even width in [2, head] is computed as stated; odd, 0 or wider than the head is refused.
TEST_F(GgufModelChecks, Glm4PartialRotaryTakesEvenWidthsWithinTheHead) {
  const ArchFixture& a = kArchs[5];
  ASSERT_STREQ(a.arch, "glm4moe");
  const std::string key = "glm4moe.rope.dimension_count";
  for (uint64_t v : {uint64_t{7}, uint64_t{0}, a.head_dim + 2}) {
    const std::string msg = error_with(a, key, v);
    EXPECT_NE(msg.find(key + " = " + std::to_string(v) + " is not an even width in [2, 16]"), std::string::npos)
        << msg;
  }
  for (uint64_t v : {uint64_t{2}, uint64_t{8}, a.head_dim}) {
    EXPECT_EQ(error_with(a, key, v), "<no exception>") << v;
    EXPECT_EQ(GgufModel(x_).config().rope_dim(), int(v));
  }
}

// deepseek2's rope.dimension_count is MLA's qk_rope_head_dim: required, even, below the per-head
// key length (18 here: 10 nope + 8 rope), and with kv_lora_rank (20) the MQA key_length (28).
TEST_F(GgufModelChecks, DeepseekRopeWidthIsCheckedAgainstTheLatentAttention) {
  const ArchFixture& a = kArchs[6];
  ASSERT_STREQ(a.arch, "deepseek2");
  const std::string key = "deepseek2.rope.dimension_count";
  for (const auto& [v, needle] : std::vector<std::pair<uint64_t, std::string>>{
           {7, "rope dims 7 (deepseek2.rope.dimension_count), key length 18"},
           {0, "rope dims 0 (deepseek2.rope.dimension_count), key length 18"},
           {18, "rope dims 18 (deepseek2.rope.dimension_count), key length 18"},
           {6, "deepseek2.attention.key_length = 28 contradicts the tensors (26)"}}) {
    const std::string msg = error_with(a, key, v);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
  EXPECT_NE(error_with(a, key, std::nullopt).find(key), std::string::npos);
}

// A block_count below the blocks the tensors hold would leave the last blocks out of the model
// (and glm4moe's or deepseek2's MTP block would become a decoder layer): refused, naming both.
TEST_F(GgufModelChecks, BlockCountBelowTheTensorsIsRefusedNamingBoth) {
  for (const ArchFixture& a : kArchs) {
    const std::string key = std::string(a.arch) + ".block_count";
    SCOPED_TRACE(key);
    const std::string msg = error_with(a, key, a.blocks - 1);
    EXPECT_NE(msg.find("metadata " + key + " = " + std::to_string(a.blocks - 1) + " contradicts the tensors, which "
                       "hold " + std::to_string(a.blocks) + " blocks (tensor 'blk." + std::to_string(a.blocks - 1) + "."),
              std::string::npos)
        << msg;
    // One more than the tensors hold: a decoder layer's tensor is missing (glm4moe's MTP block,
    // which holds no attention, then counts as one).
    const std::string more = error_with(a, key, a.blocks + 1);
    const uint64_t missing = std::string(a.arch) == "glm4moe" ? a.blocks - 1 : a.blocks;
    EXPECT_NE(more.find("tensor 'blk." + std::to_string(missing) + "."), std::string::npos) << more;
    EXPECT_NE(more.find("is missing"), std::string::npos) << more;
  }
}

// nextn_predict_layers makes the last blocks MTP blocks, which are not read: one that holds a
// decoder layer (no blk.N.nextn.* tensor) would be left out of the model; one stripped of every
// tensor is fine (glm4moe's, below).
TEST_F(GgufModelChecks, NextnBlocksMustBeMtpBlocks) {
  for (const ArchFixture& a : kArchs) {
    if (std::string(a.arch) == "gpt-oss" || std::string(a.arch) == "glm4moe") continue;  // none; has one
    const std::string key = std::string(a.arch) + ".nextn_predict_layers";
    const std::string msg = error_with(a, key, 1);
    EXPECT_NE(msg.find("metadata " + key + " = 1 makes block " + std::to_string(a.blocks - 1) +
                       " an MTP block, but the tensors hold a decoder layer there (tensor 'blk." +
                       std::to_string(a.blocks - 1) + "."),
              std::string::npos)
        << msg;
  }
  test::GgufRewrite stripped;  // glm4moe's MTP block without its tensors: still block 3 of 4
  stripped.tensor = [](GgufTensorSpec& t) { return !t.name.starts_with("blk.3."); };
  test::rewrite_gguf(kFixtures / kArchs[5].file, x_, stripped);
  EXPECT_EQ(test::gguf_load_error(x_), "<no exception>");
}

// deepseek2 attends through one latent: head_count_kv is 1 (the converter's MQA view) or, in older
// files, the head count; anything else is refused naming both.
TEST_F(GgufModelChecks, DeepseekKvHeadsAreOneOrTheHeads) {
  const ArchFixture& a = kArchs[6];
  const std::string key = "deepseek2.attention.head_count_kv";
  const std::string msg = error_with(a, key, 2);
  EXPECT_NE(msg.find(key + " = 2 is neither 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("deepseek2.attention.head_count = 3"), std::string::npos) << msg;
  EXPECT_EQ(error_with(a, key, 3), "<no exception>");
}

}  // namespace
