// GGUF input (issues 20, 21): every transformers fixture converted by llama.cpp's converter
// (tests/fixtures/gguf_hf's manifest: gpt-oss, deepseek2, qwen2moe, glm4moe; made by
// scripts/make_gguf_fixtures.py --from-hf-fixtures) run in place, converted to a pack and with its
// experts permuted by the GGUF repack, against transformers' reference logits and greedy tokens.
// For gpt-oss and deepseek2 also: the configuration read from the metadata; the older unsplit
// attn_kv_b form; and clear errors for missing or misshapen tensors and settings the engine does
// not compute (qwen2moe and glm4moe: gguf_qwen2_glm4_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/gguf_repack.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"
#include "runtime/convert/convert.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/fixture_manifest.h"
#include "tests/support/gguf_rewrite.h"
#include "tests/support/greedy_compare.h"
#include "tests/support/logit_compare.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using json = nlohmann::json;

namespace {

const fs::path kRoot = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures" / "gguf_hf";

struct Case {
  std::string fixture;  // manifest name
  bool converted;       // through convert_model instead of in place
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << (c.converted ? "/pack" : "/in_place"); }
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  std::string n = i.param.fixture + (i.param.converted ? "_pack" : "_in_place");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

// F32 and BF16 files must match transformers as the f32/bf16 packs do (1e-3 relative, identical
// greedy tokens; the fixtures' weights are bf16 values, measured <= 1e-6). Q8_0 and MXFP4 get
// reference_test's q8 budget, ggml rounding the activations to 8 bits (measured: Q8_0 0.035 and
// 25/26 top-1, MXFP4 0.014 and 26/26).
struct Tolerance {
  double max_rel_err;
  double min_top1_agreement;
  bool exact;
};
Tolerance tolerance_for(const std::string& fixture) {
  if (fixture.ends_with("-F32") || fixture.ends_with("-BF16")) return {1e-3, 1.0, true};
  return {0.10, 0.85, false};
}

// Logits of every prompt position and 32 greedy tokens against the reference.
void check_against_reference(Model& model, const json& ref, const Tolerance& tol, const std::string& what) {
  const size_t V = size_t(model.config().vocab_size);
  double worst = 0;
  size_t positions = 0, top1_same = 0, greedy_same = 0, greedy_total = 0;
  for (size_t p = 0; p < ref["prompts"].size(); ++p) {
    const std::vector<int> prompt = ref["prompts"][p].get<std::vector<int>>();
    std::vector<float> got(prompt.size() * V);
    model.reset();
    model.forward(prompt, got, true);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const std::vector<float> w = ref["logits"][p][t].get<std::vector<float>>();
      ASSERT_EQ(w.size(), V);
      const float* g = got.data() + t * V;
      const test::RowError e = test::row_error(w, g);
      worst = std::max(worst, e.err / e.scale);
      ++positions;
      top1_same += test::same_top1(w, g);
      if (tol.exact) {
        EXPECT_LE(e.err, tol.max_rel_err * e.scale) << what << " prompt " << p << " position " << t;
      }
    }
    const std::vector<int> want = ref["greedy"][p].get<std::vector<int>>();
    const std::vector<int> ids = test::greedy_tokens(model, prompt, want.size());
    greedy_same += test::matching_prefix(ids, want);
    greedy_total += want.size();
    if (tol.exact) {
      EXPECT_EQ(ids, want) << what << " prompt " << p << " greedy tokens differ";
    }
  }
  std::printf("[ measured ] %s: rel err max %.3g, top-1 %zu/%zu, greedy prefix %zu/%zu\n", what.c_str(), worst,
              top1_same, positions, greedy_same, greedy_total);
  EXPECT_LE(worst, tol.max_rel_err) << what;
  EXPECT_GE(double(top1_same) / double(positions), tol.min_top1_agreement) << what;
}

class GgufArchReference : public ::testing::TestWithParam<Case> {};

std::vector<Case> cases() {
  std::vector<Case> out;
  const json m = test::fixture_manifest(kRoot);
  if (m.contains("fixtures"))
    for (const json& e : m["fixtures"])
      for (bool conv : {false, true}) out.push_back({e["name"].get<std::string>(), conv});
  if (out.empty()) out.push_back({"none", false});
  return out;
}

}  // namespace

TEST_P(GgufArchReference, LogitsAndGreedyTokensMatchTransformers) {
  const Case& c = GetParam();
  const json m = test::fixture_manifest(kRoot);
  if (!m.contains("fixtures")) MOESTREAM_SKIP_OR_FAIL() << kRoot << " has no manifest.json";
  const auto it = std::find_if(m["fixtures"].begin(), m["fixtures"].end(),
                               [&](const json& e) { return e["name"] == c.fixture; });
  ASSERT_NE(it, m["fixtures"].end());
  const fs::path gguf = kRoot / (*it)["file"].get<std::string>();
  const json ref = json::parse(read_file(kRoot / (*it)["reference"].get<std::string>()));
  TempDir tmp("gguf_arch_test");
  fs::path model_path = gguf;
  if (c.converted) {
    ConvertOptions co;
    co.progress = false;
    convert_model(gguf, tmp.path() / "pack", co);
    model_path = tmp.path() / "pack";
  }
  ModelOptions mo;
  mo.n_threads = 2;
  auto model = Model::load(model_path, mo);
  EXPECT_EQ(model->config().format, c.converted ? ModelFormat::kPack : ModelFormat::kGguf);
  check_against_reference(*model, ref, tolerance_for(c.fixture), c.fixture + (c.converted ? " (pack)" : " (in place)"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufArchReference, ::testing::ValuesIn(cases()), case_name);

namespace {

fs::path fixture(const std::string& name) { return kRoot / (name + ".gguf"); }

GgufValue u32(uint32_t v) { return GgufValue::from_unsigned(GgufValueType::kU32, v); }

}  // namespace

TEST(GgufArchConfig, GptOssMetadataBecomesTheConfig) {
  const fs::path p = fixture("gpt_oss-F32");
  if (!fs::exists(p)) MOESTREAM_SKIP_OR_FAIL() << p << " absent";
  const GgufModel g(p);
  const ModelConfig& c = g.config();
  EXPECT_EQ(c.arch, Arch::kGptOss);
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_TRUE(c.attention_sinks && c.o_bias && c.qkv_bias && c.router_bias && c.router_softmax_topk && c.expert_bias);
  EXPECT_EQ(c.sliding_window, 6);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, true}));  // llama.cpp's pattern 2
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 1.25);  // gpt-oss.swiglu_clamp_exp
  EXPECT_NEAR(c.swiglu_alpha, 1.702, 1e-12);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_FALSE(c.rope_scaling->truncate);
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 150000.0);
  EXPECT_TRUE(g.experts().at(0).bias);
  EXPECT_EQ(g.dense_tensor("layers.1.ffn_norm").name, "blk.1.post_attention_norm.weight");
  EXPECT_EQ(g.dense_tensor("layers.2.sinks").name, "blk.2.attn_sinks.weight");

  // Without swiglu_clamp_exp: llama.cpp's (and gpt-oss's) limit 7.
  TempDir tmp("gguf_arch_test");
  test::GgufRewrite r;
  r.meta["gpt-oss.swiglu_clamp_exp"] = std::nullopt;
  test::rewrite_gguf(p, tmp.path() / "x.gguf", r);
  EXPECT_DOUBLE_EQ(GgufModel(tmp.path() / "x.gguf").config().swiglu_limit, 7.0);
}

TEST(GgufArchConfig, GptOssMxfp4ExpertsStayMxfp4) {
  const fs::path p = fixture("gpt_oss_mxfp4-MXFP4");
  if (!fs::exists(p)) MOESTREAM_SKIP_OR_FAIL() << p << " absent";
  const GgufModel g(p);
  for (const ExpertTypes& t : g.config().layer_expert_types) {
    EXPECT_EQ(t.gate, ggml_quant(GgmlType::kMXFP4));
    EXPECT_EQ(t.up, ggml_quant(GgmlType::kMXFP4));
    EXPECT_EQ(t.down, ggml_quant(GgmlType::kMXFP4));
  }
}

TEST(GgufArchConfig, DeepseekMetadataBecomesTheConfig) {
  const fs::path p3 = fixture("deepseek_v3-F32"), p2 = fixture("deepseek_v2-F32");
  if (!fs::exists(p3) || !fs::exists(p2)) MOESTREAM_SKIP_OR_FAIL() << "deepseek fixtures absent";
  const ModelConfig c = GgufModel(p3).config();
  EXPECT_EQ(c.arch, Arch::kDeepseekV3);
  EXPECT_EQ(c.q_lora_rank, 24);
  EXPECT_EQ(c.kv_lora_rank, 20);
  EXPECT_EQ(c.qk_nope_head_dim, 10);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 12);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 72);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 19);
  EXPECT_FALSE(c.shared_expert_gated);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_NEAR(c.rope_scaling->mscale, 0.7, 1e-6);
  EXPECT_NEAR(c.rope_scaling->mscale_all_dim, 0.7, 1e-6);
  const GgufModel g2(p2);
  const ModelConfig& v2 = g2.config();
  EXPECT_EQ(v2.arch, Arch::kDeepseekV2);
  EXPECT_EQ(v2.q_lora_rank, 0);
  EXPECT_EQ(v2.router_scoring, RouterScoring::kSoftmax);
  EXPECT_FALSE(v2.norm_topk_prob);
  EXPECT_EQ(v2.shared_expert_intermediate_size, 2 * 21);
  EXPECT_EQ(g2.experts().size(), 2u);  // MoE layers only
  EXPECT_TRUE(g2.dense_is_derived("layers.0.wkv_b"));
  EXPECT_TRUE(g2.dense_is_derived("layers.0.wq"));  // RoPE rows de-interleaved
  EXPECT_EQ(g2.dense_tensor("layers.1.shared_up").name, "blk.1.ffn_up_shexp.weight");
}

// Older converters wrote kv_b whole (attn_kv_b, our layout): the same model must compute the same.
TEST(GgufArchConfig, DeepseekUnsplitKvBMatchesTheSplitForm) {
  const fs::path p = fixture("deepseek_v3-F32");
  if (!fs::exists(p)) MOESTREAM_SKIP_OR_FAIL() << p << " absent";
  const GgufModel g(p);
  const GgufDequantizer f32 = [](GgmlType t, const uint8_t* in, size_t rows, size_t cols, float* out) {
    ASSERT_EQ(t, GgmlType::kF32);
    std::memcpy(out, in, rows * cols * sizeof(float));
  };
  test::GgufRewrite r;
  r.tensor = [](GgufTensorSpec& s) {
    return s.name.find("attn_k_b") == std::string::npos && s.name.find("attn_v_b") == std::string::npos;
  };
  for (int l = 0; l < g.config().n_layers; ++l) {
    const std::string name = "blk." + std::to_string(l) + ".attn_kv_b.weight";
    const GgufDerivedTensor kv = *g.derived_tensor("layers." + std::to_string(l) + ".wkv_b", f32);
    r.extra.push_back({name, GgmlType::kF32, kv.dims});
    r.bytes[name] = kv.bytes;
  }
  TempDir tmp("gguf_arch_test");
  test::rewrite_gguf(p, tmp.path() / "kvb.gguf", r);
  EXPECT_FALSE(GgufModel(tmp.path() / "kvb.gguf").dense_is_derived("layers.1.wkv_b"));
  ModelOptions mo;
  mo.n_threads = 2;
  auto model = Model::load(tmp.path() / "kvb.gguf", mo);
  check_against_reference(*model, json::parse(read_file(kRoot / "deepseek_v3.reference.json")), {1e-3, 1.0, true},
                          "deepseek_v3 attn_kv_b");
}

// Each case writes a fixture with one edit to x.gguf and expects its load error to name the fault.
class GgufArchErrors : public ::testing::Test {
 protected:
  void expect(const fs::path& src, const test::GgufRewrite& r, const std::string& needle) {
    test::rewrite_gguf(src, x_, r);
    const std::string msg = test::gguf_load_error(x_);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }

  TempDir tmp_{"gguf_arch_test"};
  const fs::path x_ = tmp_.path() / "x.gguf";
};

TEST_F(GgufArchErrors, MissingOrMisshapenTensorsAreNamed) {
  const fs::path oss = fixture("gpt_oss-F32"), ds = fixture("deepseek_v3-F32");
  if (!fs::exists(oss) || !fs::exists(ds)) MOESTREAM_SKIP_OR_FAIL() << "fixtures absent";
  expect(oss, test::dropping("blk.1.attn_sinks.weight"), "tensor 'blk.1.attn_sinks.weight' is missing");
  expect(oss, test::reshaping("blk.2.ffn_up_exps.bias", {31, 8}),
         "tensor 'blk.2.ffn_up_exps.bias' has shape [31, 8], expected [32, 8]");
  expect(oss, test::retyping("blk.0.ffn_down_exps.bias", GgmlType::kF16),
         "blk.0.ffn_down_exps.bias' has type F16; expert biases must be F32");
  expect(oss, test::dropping("blk.0.post_attention_norm.weight"), "blk.0.post_attention_norm.weight' is missing");

  test::GgufRewrite fused;
  fused.tensor = [](GgufTensorSpec& s) {
    if (s.name == "blk.0.ffn_gate_exps.weight") s.name = "blk.0.ffn_gate_up_exps.weight";
    return true;
  };
  expect(oss, fused, "'blk.0.ffn_gate_up_exps.weight' holds gate and up fused");
  expect(ds, test::dropping("blk.1.ffn_gate_exps.weight"), "tensor 'blk.1.ffn_gate_exps.weight' is missing");
  expect(ds, test::dropping("blk.2.attn_k_b.weight"), "tensor 'blk.2.attn_k_b.weight' is missing");
  expect(ds, test::reshaping("blk.1.attn_v_b.weight", {20, 11, 3}),
         "tensor 'blk.1.attn_v_b.weight' has shape [20, 11, 3], expected [20, 12, 3]");
  expect(ds, test::dropping("blk.0.ffn_gate.weight"), "tensor 'blk.0.ffn_gate.weight' is missing");
  expect(ds, test::dropping("blk.2.ffn_up_shexp.weight"), "tensor 'blk.2.ffn_up_shexp.weight' is missing");
  expect(ds, test::reshaping("blk.0.attn_q_b.weight", {24, 53}),
         "tensor 'blk.0.attn_q_b.weight' has shape [24, 53], expected [24, 54]");
}

TEST_F(GgufArchErrors, UnsupportedSettingsAreRefusedByName) {
  const fs::path oss = fixture("gpt_oss-F32"), ds = fixture("deepseek_v3-F32"), v2 = fixture("deepseek_v2-F32");
  if (!fs::exists(oss) || !fs::exists(ds) || !fs::exists(v2)) MOESTREAM_SKIP_OR_FAIL() << "fixtures absent";
  expect(ds, test::setting("deepseek2.expert_gating_func", u32(4)), "deepseek2.expert_gating_func 4 is not supported");
  expect(v2, test::setting("deepseek2.expert_group_count", u32(4)), "softmax routing with expert groups (4)");
  expect(ds, test::setting("deepseek2.attention.key_length", u32(30)),
         "deepseek2.attention.key_length = 30 contradicts the tensors (28)");
  expect(ds, test::setting("deepseek2.leading_dense_block_count", u32(3)),
         "leading_dense_block_count 3 leaves no MoE layer of 3");
  expect(oss, test::setting("gpt-oss.swiglu_clamp_exp", GgufValue::from_float(GgufValueType::kF32, -1.0)),
         "gpt-oss.swiglu_clamp_exp must be one positive limit");
  expect(oss, test::setting("gpt-oss.rope.freq_base_swa", GgufValue::from_float(GgufValueType::kF32, 10000.0)),
         "rope.freq_base_swa differs from rope.freq_base");
  expect(oss, test::setting("gpt-oss.expert_count", u32(9)), "gpt-oss.expert_count = 9 contradicts the tensors (8)");
  expect(oss, test::setting("gpt-oss.attention.sliding_window", std::nullopt), "gpt-oss.attention.sliding_window");
}

// cluster_experts on a GGUF permutes the expert ids themselves (cluster/gguf_repack.h): with the
// leading dense layers skipped, the router rows, correction bias and expert biases moved with
// the experts, the repacked file must compute what the original does. DeepSeek's and GLM-4.5's
// grouped routing takes runs of consecutive ids as groups, so orders stay inside groups (one that
// crosses is refused); gpt-oss and Qwen2-MoE have no groups and take any order.
TEST(GgufArchRepack, PermutedExpertsComputeTheSameLogits) {
  TempDir tmp("gguf_arch_test");
  // glm4moe: a dense first layer and n_group 4; qwen2moe: a shared expert outside the permutation.
  for (const char* name : {"deepseek_v3-F32", "gpt_oss-F32", "glm4moe-F32", "qwen2moe-F32"}) {
    const fs::path src = fixture(name);
    if (!fs::exists(src)) MOESTREAM_SKIP_OR_FAIL() << src << " absent";
    const cluster::GgufLayout layout = cluster::read_gguf_layout(src, IoEngineOptions{});
    const GgufModel g(src);
    const uint32_t L = uint32_t(g.config().n_moe_layers()), E = uint32_t(g.config().n_experts);
    ASSERT_EQ(layout.packed.want.n_layers, L) << name << ": routing logs number MoE layers";
    ASSERT_EQ(layout.routing_groups, uint32_t(g.config().n_group));
    std::vector<std::vector<uint32_t>> slots(L, std::vector<uint32_t>(E));
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t e = 0; e < E; ++e) slots[l][e] = (E - 1 - e + 3 * l) % E;  // crosses every group
    std::vector<std::vector<uint32_t>> order;
    for (auto& s : slots) {
      if (layout.routing_groups > 1) {
        EXPECT_THROW(cluster::repack_gguf_experts(src, tmp.path() / "bad.gguf", {cluster::order_of_slots(s)}), ConfigError);
        s = cluster::slots_within_groups(s, layout.routing_groups);
      }
      order.push_back(cluster::order_of_slots(s));
    }
    if (layout.routing_groups > 1) {
      std::vector<std::vector<uint32_t>> crossing;
      for (uint32_t l = 0; l < L; ++l) {
        std::vector<uint32_t> o(E);
        for (uint32_t i = 0; i < E; ++i) o[i] = (i + E / layout.routing_groups) % E;
        crossing.push_back(o);
      }
      EXPECT_THROW(cluster::repack_gguf_experts(src, tmp.path() / "bad.gguf", crossing), ConfigError) << name;
      EXPECT_FALSE(fs::exists(tmp.path() / "bad.gguf"));
    }
    const fs::path out = tmp.path() / (std::string(name) + ".gguf");
    cluster::repack_gguf_experts(src, out, order);
    const json m = test::fixture_manifest(kRoot);
    const auto it = std::find_if(m["fixtures"].begin(), m["fixtures"].end(), [&](const json& e) { return e["name"] == name; });
    ASSERT_NE(it, m["fixtures"].end());
    ModelOptions mo;
    mo.n_threads = 2;
    auto model = Model::load(out, mo);
    check_against_reference(*model, json::parse(read_file(kRoot / (*it)["reference"].get<std::string>())),
                            tolerance_for(name), std::string(name) + " (repacked)");
  }
}
