// Tests of runtime/model/layer_plan.h: each family's description builds the layers its config
// holds, and a config the family's layers cannot account for is refused, not run.
#include <gtest/gtest.h>

#include "runtime/model/layer_plan.h"
#include "support/test_model.h"

namespace moestream {
namespace {

using test::error_message;
using test::tiny_moe_config;

// Every layer of `plan`: GQA with `qk_norm` and no window, then routed experts (MoE layer l, no
// shared expert).
void expect_gqa_then_routed_in_every_layer(const std::vector<LayerSpec>& plan, QkNorm qk_norm) {
  for (size_t l = 0; l < plan.size(); ++l) {
    const LayerSpec& s = plan[l];
    EXPECT_EQ(s.attention.kind, AttentionKind::kGqa);
    EXPECT_EQ(s.attention.qk_norm, qk_norm);
    EXPECT_EQ(s.attention.window, 0);
    EXPECT_EQ(s.ffn.kind, FfnKind::kRouted);
    EXPECT_EQ(s.ffn.moe_layer, int(l));
    EXPECT_EQ(s.ffn.shared, SharedExpertKind::kNone);
  }
}

TEST(LayerPlan, Qwen3MoeIsGqaWithPerHeadNormThenRoutedExperts) {
  const ModelConfig c = tiny_moe_config({.layers = 3});
  const std::vector<LayerSpec> plan = plan_layers(c);
  ASSERT_EQ(plan.size(), 3u);
  expect_gqa_then_routed_in_every_layer(plan, QkNorm::kPerHead);
  for (const LayerSpec& s : plan) EXPECT_EQ(s.ffn.router.params.k, c.n_experts_per_tok);
}

TEST(LayerPlan, GlmHasADenseFirstLayerAndNumbersMoeLayersAfterIt) {
  ModelConfig c = tiny_moe_config({.layers = 3});
  test::as_glm4_moe(c, {.shared = 16, .dense_intermediate = 24, .rotary_dim = 6});
  const std::vector<LayerSpec> plan = plan_layers(c);
  EXPECT_EQ(plan[0].ffn.kind, FfnKind::kDense);
  EXPECT_EQ(plan[1].ffn.kind, FfnKind::kRouted);
  EXPECT_EQ(plan[1].ffn.moe_layer, 0);
  EXPECT_EQ(plan[2].ffn.moe_layer, 1);
  EXPECT_EQ(plan[1].ffn.shared, SharedExpertKind::kUngated);
  EXPECT_EQ(plan[1].ffn.router.params.scoring, RouterScoring::kSigmoid);
  EXPECT_TRUE(plan[0].attention.qkv_bias);
  EXPECT_FALSE(any_attention(plan, AttentionKind::kMla));
  EXPECT_TRUE(any_ffn(plan, FfnKind::kDense));
}

// MiniMax-M2 composes existing blocks only: OLMoE's full-width QK-norm, GLM-4.5's partial rotary and
// sigmoid router (one group, no scaling), no shared expert, experts in every layer.
TEST(LayerPlan, MinimaxM2IsGqaWithFullQkNormThenSigmoidRoutedExpertsInEveryLayer) {
  ModelConfig c = tiny_moe_config({.layers = 3, .head_dim = 8});
  test::as_minimax_m2(c, 4);
  const std::vector<LayerSpec> plan = plan_layers(c);
  ASSERT_EQ(plan.size(), 3u);
  expect_gqa_then_routed_in_every_layer(plan, QkNorm::kFull);
  for (const LayerSpec& s : plan) {
    EXPECT_FALSE(s.attention.sinks || s.attention.qkv_bias || s.attention.o_bias);
    const RouterParams& r = s.ffn.router.params;
    EXPECT_EQ(r.scoring, RouterScoring::kSigmoid);
    EXPECT_EQ(r.n_group, 1);
    EXPECT_TRUE(r.normalize);
    EXPECT_EQ(r.scaling, 1.0f);
    EXPECT_FALSE(s.ffn.router.logit_bias || s.ffn.router.softmax_of_top_k);
  }
  EXPECT_EQ(c.rope_dim(), 4);  // the attention block rotates rope_dim() of each head
  // A dense layer is refused as for every family without one.
  c.first_k_dense_replace = 1;
  c.intermediate_size = 24;
  const std::string msg = error_message<ConfigError>([&] { plan_layers(c); });
  EXPECT_NE(msg.find("minimax_m2, layer 0"), std::string::npos) << msg;
}

TEST(LayerPlan, DeepseekIsLatentAttentionInEveryLayer) {
  ModelConfig c = tiny_moe_config({.layers = 2, .heads = 4, .kv_heads = 4, .head_dim = 12});
  test::as_deepseek_v3(c, {.q_lora = 16, .kv_lora = 12, .nope = 8, .rope = 4, .v = 8, .shared = 16,
                           .dense_intermediate = 24});
  const std::vector<LayerSpec> plan = plan_layers(c);
  for (const LayerSpec& s : plan) EXPECT_EQ(s.attention.kind, AttentionKind::kMla);
  EXPECT_EQ(plan[0].ffn.kind, FfnKind::kDense);
  EXPECT_EQ(plan[1].ffn.kind, FfnKind::kRouted);
  EXPECT_FALSE(any_attention(plan, AttentionKind::kGqa));
}

TEST(LayerPlan, GptOssAlternatesSlidingAndFullLayersWithSinks) {
  ModelConfig c = tiny_moe_config({.layers = 4});
  c.arch = Arch::kGptOss;
  c.qk_norm = QkNorm::kNone;
  c.attention_sinks = c.o_bias = c.qkv_bias = c.router_bias = c.router_softmax_topk = true;
  c.sliding_window = 8;
  c.sliding_layers = {true, false, true, false};
  const std::vector<LayerSpec> plan = plan_layers(c);
  EXPECT_EQ(plan[0].attention.window, 8);
  EXPECT_EQ(plan[1].attention.window, 0);
  EXPECT_EQ(plan[2].attention.window, 8);
  for (const LayerSpec& s : plan) {
    EXPECT_TRUE(s.attention.sinks && s.attention.o_bias && s.attention.qkv_bias);
    EXPECT_TRUE(s.ffn.router.logit_bias && s.ffn.router.softmax_of_top_k);
  }
}

TEST(LayerPlan, AConfigTheFamilysLayersDoNotHoldIsRefused) {
  ModelConfig dense = tiny_moe_config({.layers = 3});
  dense.first_k_dense_replace = 1;  // Qwen3-MoE has no dense layers
  dense.intermediate_size = 24;
  const std::string msg = error_message<ConfigError>([&] { plan_layers(dense); });
  EXPECT_NE(msg.find("qwen3_moe, layer 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("first_k_dense_replace 1"), std::string::npos) << msg;

  ModelConfig latent = tiny_moe_config({.layers = 2});
  latent.kv_lora_rank = 8;  // MLA fields on a family without latent attention
  const std::string msg2 = error_message<ConfigError>([&] { plan_layers(latent); });
  EXPECT_NE(msg2.find("mla fields"), std::string::npos) << msg2;
}

}  // namespace
}  // namespace moestream
