// GGUF input for qwen2moe and glm4moe (issues 20, 21; loader/format/gguf_arch_qwen2_glm4.cpp).
// Their files in tests/fixtures/gguf_hf run against transformers with the other architectures'
// (gguf_arch_test's GgufArchReference, from the manifest). Here: the config read from the metadata
// equals the one read from config.json, missing, misshapen or unsupported tensors and keys are
// refused naming what is wrong, and the optional layouts (no MTP block, a 1-D shared-expert gate)
// load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"
#include "runtime/convert/convert.h"
#include "runtime/convert/hf_config.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/gguf_rewrite.h"
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;
using test::dropping;
using test::reshaping;
using test::setting;

namespace {

const fs::path kFixtures = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";

class GgufQwen2Glm4 : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"qwen2moe-F32.gguf", "glm4moe-F32.gguf"})
      if (!fs::exists(kFixtures / "gguf_hf" / f))
        MOESTREAM_SKIP_OR_FAIL() << "fixture " << f << " absent (scripts/make_gguf_fixtures.py --from-hf-fixtures)";
  }

  // A copy of fixture `name` with `r` applied.
  fs::path rewrite(const std::string& name, const test::GgufRewrite& r) {
    const fs::path out = dir_.path() / (name + "-edited.gguf");
    test::rewrite_gguf(kFixtures / "gguf_hf" / (name + ".gguf"), out, r);
    return out;
  }
  static std::string error_of(const fs::path& path) { return test::gguf_load_error(path); }

  TempDir dir_{"gguf_qwen2_glm4_err"};
};

ModelConfig hf_config(const std::string& source) {
  const fs::path p = kFixtures / source / "config.json";
  return model_config_from_hf(nlohmann::json::parse(read_file(p)), p.string());
}

}  // namespace

// Every hyper-parameter the metadata states is what config.json says: shared experts and their
// gate, biases, leading dense layers, grouped sigmoid routing, routed scaling, partial rotary,
// QK-norm (the MTP block glm4moe's block_count counts is not a decoder layer).
TEST_F(GgufQwen2Glm4, ConfigFromMetadataEqualsTheTransformersConfig) {
  for (const auto& [gguf, source] : {std::pair{"qwen2moe-F32", "qwen2_moe"}, std::pair{"glm4moe-BF16", "glm4_moe"}}) {
    SCOPED_TRACE(gguf);
    const ModelConfig g = GgufModel(kFixtures / "gguf_hf" / (std::string(gguf) + ".gguf")).config();
    const ModelConfig h = hf_config(source);
    EXPECT_EQ(g.arch, h.arch);
    EXPECT_EQ(g.n_layers, h.n_layers);
    EXPECT_EQ(g.hidden_size, h.hidden_size);
    EXPECT_EQ(g.head_dim, h.head_dim);
    EXPECT_EQ(g.n_heads, h.n_heads);
    EXPECT_EQ(g.n_kv_heads, h.n_kv_heads);
    EXPECT_EQ(g.n_experts, h.n_experts);
    EXPECT_EQ(g.n_experts_per_tok, h.n_experts_per_tok);
    EXPECT_EQ(g.moe_intermediate_size, h.moe_intermediate_size);
    EXPECT_EQ(g.norm_topk_prob, h.norm_topk_prob);
    EXPECT_EQ(g.qk_norm, h.qk_norm);
    EXPECT_EQ(g.qkv_bias, h.qkv_bias);
    EXPECT_EQ(g.shared_expert_intermediate_size, h.shared_expert_intermediate_size);
    EXPECT_EQ(g.shared_expert_gated, h.shared_expert_gated);
    EXPECT_EQ(g.router_scoring, h.router_scoring);
    EXPECT_EQ(g.n_group, h.n_group);
    EXPECT_EQ(g.topk_group, h.topk_group);
    EXPECT_FLOAT_EQ(float(g.routed_scaling_factor), float(h.routed_scaling_factor));
    EXPECT_EQ(g.first_k_dense_replace, h.first_k_dense_replace);
    EXPECT_EQ(g.intermediate_size, h.intermediate_size);
    EXPECT_EQ(g.rope_dim(), h.rope_dim());
    EXPECT_DOUBLE_EQ(g.rope_theta, h.rope_theta);
    EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  }
  // The fixtures exercise what they are meant to: a gated shared expert; the grouped router, a
  // dense first layer, an ungated shared expert and partial rotary.
  const ModelConfig q = GgufModel(kFixtures / "gguf_hf" / "qwen2moe-F32.gguf").config();
  EXPECT_TRUE(q.qkv_bias && q.has_shared_expert() && q.shared_expert_gated && !q.norm_topk_prob);
  const ModelConfig g = GgufModel(kFixtures / "gguf_hf" / "glm4moe-F32.gguf").config();
  EXPECT_EQ(g.n_moe_layers(), 2);
  EXPECT_GT(g.n_group, 1);
  EXPECT_LT(g.rope_dim(), g.head_dim);
}

TEST_F(GgufQwen2Glm4, MissingTensorsAreNamed) {
  const struct {
    const char* fixture;
    const char* tensor;
  } cases[] = {
      {"qwen2moe-F32", "blk.2.ffn_gate_inp_shexp.weight"}, {"qwen2moe-F32", "blk.1.attn_v.bias"},
      {"qwen2moe-F32", "blk.0.ffn_gate_shexp.weight"},     {"glm4moe-F32", "blk.2.exp_probs_b.bias"},
      {"glm4moe-F32", "blk.0.ffn_down.weight"},            {"glm4moe-F32", "blk.1.ffn_up_shexp.weight"},
      {"glm4moe-F32", "blk.2.post_attention_norm.weight"}, {"glm4moe-F32", "blk.1.ffn_gate_exps.weight"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tensor);
    const fs::path p = rewrite(c.fixture, dropping(c.tensor));
    EXPECT_NE(error_of(p).find("'" + std::string(c.tensor) + "'"), std::string::npos) << error_of(p);
  }
}

TEST_F(GgufQwen2Glm4, MisshapenTensorsAreNamedWithBothShapes) {
  const struct {
    const char* fixture;
    const char* tensor;
    std::vector<uint64_t> dims;
    const char* expected;
  } cases[] = {
      {"qwen2moe-F32", "blk.1.ffn_up_shexp.weight", {47, 40}, "[47, 41]"},
      {"qwen2moe-F32", "blk.2.ffn_gate_inp_shexp.weight", {46, 1}, "[47, 1]"},
      {"qwen2moe-F32", "blk.0.attn_q.bias", {47}, "[48]"},
      {"glm4moe-F32", "blk.2.exp_probs_b.bias", {15}, "[16]"},
      {"glm4moe-F32", "blk.0.ffn_gate.weight", {53, 60}, "[53, 61]"},
      {"glm4moe-F32", "blk.1.ffn_down_shexp.weight", {23, 52}, "[23, 53]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tensor);
    const fs::path p = rewrite(c.fixture, reshaping(c.tensor, c.dims));
    const std::string e = error_of(p);
    EXPECT_NE(e.find("'" + std::string(c.tensor) + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(c.expected), std::string::npos) << e;
  }
}

TEST_F(GgufQwen2Glm4, UnsupportedOrContradictoryMetadataIsRefusedNamingTheKey) {
  const struct {
    const char* fixture;
    const char* key;
    std::optional<GgufValue> value;
  } cases[] = {
      {"glm4moe-F32", "glm4moe.expert_gating_func", GgufValue::from_unsigned(GgufValueType::kU32, 1)},
      {"glm4moe-F32", "glm4moe.rope.dimension_count", GgufValue::from_unsigned(GgufValueType::kU32, 7)},
      {"glm4moe-F32", "glm4moe.leading_dense_block_count", GgufValue::from_unsigned(GgufValueType::kU32, 3)},
      {"glm4moe-F32", "glm4moe.nextn_predict_layers", GgufValue::from_unsigned(GgufValueType::kU32, 4)},
      {"glm4moe-F32", "glm4moe.expert_group_count", GgufValue::from_unsigned(GgufValueType::kU32, 3)},
      {"qwen2moe-F32", "qwen2moe.expert_shared_feed_forward_length", GgufValue::from_unsigned(GgufValueType::kU32, 40)},
      {"qwen2moe-F32", "qwen2moe.expert_gating_func", GgufValue::from_unsigned(GgufValueType::kU32, 2)},
      {"qwen2moe-F32", "qwen2moe.rope.dimension_count", GgufValue::from_unsigned(GgufValueType::kU32, 6)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    const fs::path p = rewrite(c.fixture, setting(c.key, c.value));
    // n_group 3 does not divide 16 experts: model.json's own rule, under its field name.
    const std::string key = std::string(c.key).ends_with("expert_group_count") ? "n_group" : c.key;
    EXPECT_NE(error_of(p).find(key), std::string::npos) << error_of(p);
  }
}

// A glm4moe file whose MTP block is dropped still runs (block_count then counts only the decoder
// layers), and a GGUF whose shared-expert gate is 1-D ([D], as llama.cpp asks for it) loads.
TEST_F(GgufQwen2Glm4, OptionalLayoutsLoad) {
  test::GgufRewrite mtp = setting("glm4moe.nextn_predict_layers", std::nullopt);
  mtp.meta["glm4moe.block_count"] = GgufValue::from_unsigned(GgufValueType::kU32, 3);
  mtp.tensor = [](GgufTensorSpec& s) { return !s.name.starts_with("blk.3."); };
  const fs::path no_mtp = rewrite("glm4moe-F32", mtp);
  EXPECT_EQ(GgufModel(no_mtp).config().n_layers, 3);
  test::GgufRewrite gate_1d;
  gate_1d.tensor = [](GgufTensorSpec& s) {
    if (s.name.ends_with("ffn_gate_inp_shexp.weight")) s.dims = {47};
    return true;
  };
  const fs::path flat = rewrite("qwen2moe-F32", gate_1d);
  ModelOptions mo;
  mo.n_threads = 1;
  auto m = Model::load(flat, mo);
  auto ref = Model::load(kFixtures / "gguf_hf" / "qwen2moe-F32.gguf", mo);
  const std::vector<int> prompt{5, 17, 200};
  std::vector<float> a(size_t(m->config().vocab_size)), b(a.size());
  m->forward(prompt, a);
  ref->forward(prompt, b);
  EXPECT_EQ(a, b);  // the same gate values, read from a 1-D tensor
}
