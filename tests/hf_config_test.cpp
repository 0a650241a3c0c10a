// The Hugging Face config mapping (runtime/convert/hf_config.h): each architecture's config.json
// into a ModelConfig, transformers v4 and v5 names, rope parameters, MLA (DeepSeek) configs, and the
// settings that change the maths refused with their names.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/model_config.h"
#include "runtime/convert/hf_config.h"
#include "tests/support/strict_skip.h"
#include "tests/support/tiny_hf.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::test;
using nlohmann::json;

namespace {

TEST(HfConfig, MapsEachArchitecture) {
  ModelConfig q = model_config_from_hf(make_tiny(Arch::kQwen3Moe).config, "c");
  EXPECT_EQ(q.arch, Arch::kQwen3Moe);
  EXPECT_EQ(q.head_dim, 8);
  EXPECT_EQ(q.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(q.moe_intermediate_size, 21);
  EXPECT_TRUE(q.norm_topk_prob);
  EXPECT_EQ(q.rope_theta, 1e6);
  ModelConfig o = model_config_from_hf(make_tiny(Arch::kOlmoe).config, "c");
  EXPECT_EQ(o.qk_norm, QkNorm::kFull);
  EXPECT_EQ(o.head_dim, 9);
  EXPECT_FALSE(o.norm_topk_prob);
  ModelConfig x = model_config_from_hf(make_tiny(Arch::kMixtral).config, "c");
  EXPECT_EQ(x.n_experts, 8);
  EXPECT_TRUE(x.norm_topk_prob);
  EXPECT_EQ(x.qk_norm, QkNorm::kNone);
}

TEST(HfConfig, MapsQwen2MoeBiasesAndSharedExpert) {
  json hf = make_tiny(Arch::kQwen2Moe).config;
  ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.arch, Arch::kQwen2Moe);
  EXPECT_TRUE(c.qkv_bias);  // transformers' default: released configs do not name it
  EXPECT_EQ(c.shared_expert_intermediate_size, 26);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 8);
  hf["qkv_bias"] = false;
  hf["layer_types"] = json::array({"full_attention", "full_attention", "full_attention"});
  EXPECT_FALSE(model_config_from_hf(hf, "c").qkv_bias);
  // model.json keeps both; other architectures' model.json gains neither key.
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "m").shared_expert_intermediate_size, 26);
  EXPECT_TRUE(ModelConfig::from_json(c.to_json(), "m").qkv_bias);
  const json q3 = model_config_from_hf(make_tiny(Arch::kQwen3Moe).config, "c").to_json();
  EXPECT_FALSE(q3.contains("qkv_bias"));
  EXPECT_FALSE(q3.contains("shared_expert_intermediate_size"));
  // Dense MLP layers after an MoE layer (step 2 of 3 layers: 0 and 2 dense), sliding layer_types
  // without use_sliding_window and a missing shared-expert width are refused by name.
  const std::pair<const char*, json> refused[] = {
      {"mlp_only_layers", json::array({1})},
      {"mlp_only_layers", json::array({0, 1, 2})},
      {"decoder_sparse_step", 2},
      {"layer_types", json::array({"sliding_attention", "full_attention", "full_attention"})},
      {"n_shared_experts", 2}};
  for (const auto& [key, value] : refused) {
    json bad = make_tiny(Arch::kQwen2Moe).config;
    bad[key] = value;
    std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find(key), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << msg;
  }
  json missing = make_tiny(Arch::kQwen2Moe).config;
  missing.erase("shared_expert_intermediate_size");
  std::string msg = message_of([&] { model_config_from_hf(missing, "c"); });
  EXPECT_NE(msg.find("shared_expert_intermediate_size"), std::string::npos) << msg;
}

// Qwen2-MoE's leading dense layers (mlp_only_layers, decoder_sparse_step) become
// first_k_dense_replace; use_sliding_window its sliding layers (sweep-b).
TEST(HfConfig, MapsQwen2MoeLeadingDenseLayersAndSlidingWindows) {
  json hf = make_tiny(Arch::kQwen2Moe).config;
  hf["mlp_only_layers"] = json::array({0});
  ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 64);
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "m").first_k_dense_replace, 1);
  hf["mlp_only_layers"] = json::array();
  hf["decoder_sparse_step"] = 3;  // (l + 1) % 3: layers 0 and 1 dense, 2 MoE
  EXPECT_EQ(model_config_from_hf(hf, "c").first_k_dense_replace, 2);
  hf["decoder_sparse_step"] = 1;
  EXPECT_EQ(model_config_from_hf(hf, "c").sliding_window, 0);  // use_sliding_window false
  hf["use_sliding_window"] = true;
  hf["sliding_window"] = 5;
  hf["max_window_layers"] = 2;  // transformers 5's default layer_types: even layers below it
  c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, false}));
  hf["layer_types"] = json::array({"full_attention", "sliding_attention", "sliding_attention"});
  c = ModelConfig::from_json(model_config_from_hf(hf, "c").to_json(), "m");
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.window_of(1), 5);
  EXPECT_EQ(c.window_of(0), 0);
}

TEST(HfConfig, MapsGlm4MoeRoutingSharedExpertDenseLayersAndPartialRotary) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe/config.json";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture));
  const ModelConfig c = model_config_from_hf(hf, "c");
  EXPECT_EQ(c.arch, Arch::kGlm4Moe);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.n_experts, 16);
  EXPECT_EQ(c.shared_expert_intermediate_size, 23);  // n_shared_experts x moe_intermediate_size
  EXPECT_FALSE(c.shared_expert_gated);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 61);
  EXPECT_EQ(c.rope_dim(), 8);  // partial_rotary_factor 0.5 of head_dim 16
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kPerHead);
  // transformers 5 keeps partial_rotary_factor in rope_parameters; 0 shared experts is none.
  json v5 = hf;
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
  v5["n_shared_experts"] = 0;
  v5["use_qk_norm"] = false;
  const ModelConfig c5 = model_config_from_hf(v5, "c");
  EXPECT_EQ(c5.rope_dim(), 4);
  EXPECT_FALSE(c5.has_shared_expert());
  EXPECT_EQ(c5.qk_norm, QkNorm::kNone);
  const std::pair<const char*, json> refused[] = {
      {"n_group", 3}, {"topk_group", 5}, {"first_k_dense_replace", 3}, {"partial_rotary_factor", 0.1}};
  for (const auto& [key, value] : refused) {
    json bad = hf;
    bad[key] = value;
    std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << key << ": " << msg;
  }
}

// MiniMax-M2's config.json as released (the keys of MiniMaxAI/MiniMax-M2, MTP fields included):
// the remote code's keys are checked, transformers' maths is what is read.
json minimax_m2_released() {
  json attn = json::array();
  for (int l = 0; l < 62; ++l) attn.push_back(1);
  return json{{"architectures", json::array({"MiniMaxM2ForCausalLM"})}, {"model_type", "minimax_m2"},
              {"attn_type_list", attn}, {"head_dim", 128}, {"hidden_act", "silu"}, {"hidden_size", 3072},
              {"intermediate_size", 1536}, {"max_position_embeddings", 196608}, {"num_attention_heads", 48},
              {"num_experts_per_tok", 8}, {"num_hidden_layers", 62}, {"num_key_value_heads", 8},
              {"num_local_experts", 256}, {"num_mtp_modules", 3}, {"mtp_transformer_layers", 1},
              {"use_mtp", true}, {"qk_norm_type", "per_layer"}, {"rms_norm_eps", 1e-6},
              {"rope_theta", 5000000}, {"rotary_dim", 64}, {"scoring_func", "sigmoid"},
              {"shared_intermediate_size", 0}, {"tie_word_embeddings", false}, {"use_qk_norm", true},
              {"use_routing_bias", true}, {"vocab_size", 200064}, {"bos_token_id", 200034},
              {"eos_token_id", 200020}, {"router_aux_loss_coef", 0.001}, {"router_jitter_noise", 0.0},
              {"output_router_logits", false}};
}

TEST(HfConfig, MapsMinimaxM2AsTransformersComputesIt) {
  const ModelConfig c = model_config_from_hf(minimax_m2_released(), "c");
  EXPECT_EQ(c.arch, Arch::kMinimaxM2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_heads, 48);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.moe_intermediate_size, 1536);  // intermediate_size is the expert width
  EXPECT_EQ(c.n_experts, 256);
  EXPECT_EQ(c.n_experts_per_tok, 8);
  EXPECT_EQ(c.qk_norm, QkNorm::kFull);  // q_norm over H * head_dim, k_norm over KV * head_dim
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.has_shared_expert());
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.first_k_dense_replace, 0);
  EXPECT_EQ(c.bos_token_id, 200034);
  // model.json keeps every piece.
  EXPECT_EQ(ModelConfig::from_json(c.to_json(), "m").to_json(), c.to_json());

  // transformers 5's own spelling: no rotary_dim, the factor in rope_parameters; head_dim by default 128.
  json v5 = minimax_m2_released();
  for (const char* k : {"rotary_dim", "rope_theta", "head_dim", "use_qk_norm", "qk_norm_type", "scoring_func",
                        "use_routing_bias", "attn_type_list", "shared_intermediate_size"})
    v5.erase(k);
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  const ModelConfig c5 = model_config_from_hf(v5, "c");
  EXPECT_EQ(c5.head_dim, 128);
  EXPECT_EQ(c5.rotary_dim, 32);
  EXPECT_EQ(c5.rope_theta, 1e6);
  EXPECT_EQ(c5.qk_norm, QkNorm::kFull);
  // rope_parameters' factor wins over rotary_dim, as in transformers; a factor of 1 rotates whole heads.
  v5["rotary_dim"] = 64;
  EXPECT_EQ(model_config_from_hf(v5, "c").rotary_dim, 32);
  v5["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(model_config_from_hf(v5, "c").rotary_dim, 64);
  v5.erase("rotary_dim");
  EXPECT_EQ(model_config_from_hf(v5, "c").rope_dim(), 128);
  // The tiny checkpoint of the converter's tests maps too.
  const ModelConfig t = model_config_from_hf(make_tiny(Arch::kMinimaxM2).config, "c");
  EXPECT_EQ(t.head_dim, 8);
  EXPECT_EQ(t.rotary_dim, 4);
}

TEST(HfConfig, MinimaxM2KeysThatWouldChangeTheMathsAreRefusedByName) {
  struct Bad {
    const char* key;
    json value;
    const char* expect;
  };
  const Bad cases[] = {
      {"use_qk_norm", false, "use_qk_norm"},
      {"qk_norm_type", "per_head", "qk_norm_type"},
      {"scoring_func", "softmax", "scoring_func"},
      {"use_routing_bias", false, "use_routing_bias"},
      {"shared_intermediate_size", 512, "shared_intermediate_size"},
      {"attention_bias", true, "attention_bias"},
      {"rotary_dim", 63, "not even"},
      {"rotary_dim", 0, "rotary_dim"},
      {"rotary_dim", 256, "rotary_dim"},
      {"hidden_act", "gelu", "hidden_act"},
  };
  for (const Bad& b : cases) {
    json hf = minimax_m2_released();
    hf[b.key] = b.value;
    const std::string msg = message_of([&] { model_config_from_hf(hf, "cfg.json"); });
    EXPECT_NE(msg.find(b.expect), std::string::npos) << b.key << ": " << msg;
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  }
  json lightning = minimax_m2_released();
  lightning["attn_type_list"][5] = 0;  // MiniMax-01's linear attention layer
  const std::string msg = message_of([&] { model_config_from_hf(lightning, "c"); });
  EXPECT_NE(msg.find("attn_type_list"), std::string::npos) << msg;
  EXPECT_NE(msg.find("entry 5"), std::string::npos) << msg;
}

TEST(HfConfig, ReadsRopeParametersOfTransformersV5) {
  json c = make_tiny(Arch::kQwen3Moe).config;
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 5e5}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32768}};
  ModelConfig m = model_config_from_hf(c, "c");
  EXPECT_EQ(m.rope_theta, 5e5);
  ASSERT_TRUE(m.rope_scaling.has_value());
  EXPECT_EQ(m.rope_scaling->type, "yarn");
  EXPECT_EQ(m.rope_scaling->factor, 4.0);
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_FALSE(model_config_from_hf(c, "c").rope_scaling.has_value());
}

TEST(HfConfig, SettingsThatChangeTheMathsAreRejected) {
  struct Case {
    Arch arch;
    const char* key;
    json value;
  };
  const Case cases[] = {
      {Arch::kQwen3Moe, "mlp_only_layers", json::array({1})},
      {Arch::kQwen3Moe, "decoder_sparse_step", 2},
      {Arch::kQwen3Moe, "use_sliding_window", true},
      {Arch::kQwen3Moe, "attention_bias", true},
      {Arch::kQwen3Moe, "shared_expert_intermediate_size", 64},
      {Arch::kOlmoe, "clip_qkv", 8.0},
      {Arch::kMixtral, "sliding_window", 128},
      {Arch::kMixtral, "hidden_act", "gelu"},
      {Arch::kQwen3Moe, "rope_scaling", json{{"type", "longrope"}, {"factor", 2.0}}},
      {Arch::kQwen3Moe, "rope_scaling", json{{"type", "yarn"}, {"factor", 2.0}, {"mscale", 0.7}}},
  };
  for (const Case& c : cases) {
    json cfg = make_tiny(c.arch).config;
    cfg[c.key] = c.value;
    std::string msg;
    try {
      model_config_from_hf(cfg, "hf/config.json");
      msg = "<accepted>";
    } catch (const ConfigError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.key << ": " << msg;
    EXPECT_NE(msg.find("hf/config.json"), std::string::npos) << msg;
  }
  // A sliding window as long as the context never masks: accepted.
  json cfg = make_tiny(Arch::kMixtral).config;
  cfg["sliding_window"] = 256;
  EXPECT_NO_THROW(model_config_from_hf(cfg, "c"));
}

TEST(HfConfig, AcceptsTheV5NameOfTheExpertCount) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe}) {
    json c = make_tiny(arch).config;
    c.erase("num_experts");
    c["num_local_experts"] = 12;  // transformers 5.x saves Qwen3MoeConfig this way
    EXPECT_EQ(model_config_from_hf(c, "c").n_experts, 12);
    c.erase("num_local_experts");
    std::string msg = message_of([&] { model_config_from_hf(c, "c"); });
    EXPECT_NE(msg.find("'num_experts'"), std::string::npos) << msg;
  }
}

TEST(HfConfig, UnsupportedArchitectureIsNamed) {
  json cfg = make_tiny(Arch::kQwen3Moe).config;
  cfg["architectures"] = {"LlamaForCausalLM"};
  std::string msg = message_of([&] { model_config_from_hf(cfg, "c"); });
  EXPECT_NE(msg.find("LlamaForCausalLM"), std::string::npos) << msg;
}

TEST(HfConfig, DeepseekMlaConfigsAndTheirRefusals) {
  const fs::path fx = fs::path(MOESTREAM_SOURCE_DIR) / "tests" / "fixtures";
  const json v3 = json::parse(read_file(fx / "deepseek_v3" / "config.json"));
  const json v2 = json::parse(read_file(fx / "deepseek_v2" / "config.json"));
  const ModelConfig c3 = model_config_from_hf(v3, "v3");
  EXPECT_EQ(c3.arch, Arch::kDeepseekV3);
  EXPECT_EQ(c3.head_dim, v3["qk_nope_head_dim"].get<int>() + v3["qk_rope_head_dim"].get<int>());
  EXPECT_EQ(c3.kv_lora_rank, v3["kv_lora_rank"].get<int>());
  EXPECT_EQ(c3.q_lora_rank, v3["q_lora_rank"].get<int>());
  EXPECT_EQ(c3.n_kv_heads, c3.n_heads);
  EXPECT_EQ(c3.router_scoring, RouterScoring::kSigmoid);
  ASSERT_TRUE(c3.rope_scaling.has_value());
  EXPECT_EQ(c3.rope_scaling->mscale, 0.9);
  EXPECT_EQ(c3.rope_scaling->mscale_all_dim, 0.7);
  const ModelConfig c2 = model_config_from_hf(v2, "v2");
  EXPECT_EQ(c2.arch, Arch::kDeepseekV2);
  EXPECT_EQ(c2.q_lora_rank, 0);  // null: a plain q_proj
  EXPECT_EQ(c2.router_scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(c2.shared_expert_intermediate_size, 2 * c2.moe_intermediate_size);
  EXPECT_FALSE(c2.shared_expert_gated);
  // model.json round trip keeps the MLA block.
  const ModelConfig back = ModelConfig::from_json(c3.to_json(), "model.json");
  EXPECT_EQ(back.kv_lora_rank, c3.kv_lora_rank);
  EXPECT_EQ(back.rope_scaling->mscale_all_dim, 0.7);

  struct Case {
    const json* base;
    const char* key;
    json value;
  };
  const Case cases[] = {
      {&v3, "scoring_func", "softmax"},
      {&v3, "topk_method", "greedy"},
      {&v2, "topk_method", "noaux_tc"},
      {&v2, "scoring_func", "sigmoid"},
  };
  for (const Case& c : cases) {
    json cfg = *c.base;
    cfg[c.key] = c.value;
    std::string msg = "<accepted>";
    try {
      model_config_from_hf(cfg, "hf/config.json");
    } catch (const ConfigError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.key), std::string::npos) << c.key << ": " << msg;
  }
  // DeepSeek-V2's group_limited_greedy (issue 20): groups, kept groups and the scaling are read
  // and survive model.json; groups that do not split the experts or hold k are refused.
  json g2 = v2;
  g2["topk_method"] = "group_limited_greedy";
  g2["n_group"] = 4;
  g2["topk_group"] = 2;
  g2["routed_scaling_factor"] = 16.0;
  const ModelConfig cg = model_config_from_hf(g2, "v2");
  EXPECT_EQ(cg.router_scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(cg.n_group, 4);
  EXPECT_EQ(cg.topk_group, 2);
  EXPECT_EQ(cg.routed_scaling_factor, 16.0);
  EXPECT_FALSE(cg.norm_topk_prob);
  const ModelConfig cg_back = ModelConfig::from_json(cg.to_json(), "model.json");
  EXPECT_EQ(cg_back.n_group, 4);
  EXPECT_EQ(cg_back.topk_group, 2);
  EXPECT_EQ(cg_back.routed_scaling_factor, 16.0);
  // "greedy" ignores the groups (transformers does), but not the scaling.
  json greedy = g2;
  greedy["topk_method"] = "greedy";
  EXPECT_EQ(model_config_from_hf(greedy, "v2").n_group, 1);
  EXPECT_EQ(model_config_from_hf(greedy, "v2").routed_scaling_factor, 16.0);
  for (const auto& [ng, tg] : {std::pair{5, 2}, std::pair{4, 5}, std::pair{12, 1}}) {
    json bad = g2;
    bad["n_group"] = ng;
    bad["topk_group"] = tg;
    const std::string msg = message_of([&] { model_config_from_hf(bad, "hf/config.json"); });
    EXPECT_NE(msg.find("group_limited_greedy"), std::string::npos) << ng << "/" << tg << ": " << msg;
  }
  // A model.json asking groups of gpt-oss's top-k softmax router was not written by us.
  json gj = cg.to_json();
  gj["router_softmax_topk"] = true;
  EXPECT_THROW(ModelConfig::from_json(gj, "model.json"), FormatError);

  // A model.json naming MLA sizes for another architecture was not written by us.
  json j = c3.to_json();
  j["architecture"] = "qwen3_moe";
  EXPECT_THROW(ModelConfig::from_json(j, "model.json"), FormatError);
  // Nor one asking MLA for gpt-oss's attention pieces, which MlaAttention does not have.
  for (const auto& [key, value] : {std::pair<const char*, json>{"attention_sinks", true}, {"o_bias", true}}) {
    json g = c3.to_json();
    g[key] = value;
    std::string msg = "<accepted>";
    try {
      ModelConfig::from_json(g, "model.json");
    } catch (const FormatError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("mla"), std::string::npos) << key << ": " << msg;
  }
}

// Configs python/training/arch_sweep.py (sweep-a) found read otherwise than transformers reads them.
TEST(HfConfig, SweepAGlm4MoeScaledRopeParametersAndDefaultHeadDim) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe/config.json";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture));
  // transformers 5 saves a scaled GLM's partial_rotary_factor inside rope_parameters, with the yarn keys.
  json v5 = hf;
  v5.erase("partial_rotary_factor");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0},
                           {"original_max_position_embeddings", 64}, {"partial_rotary_factor", 0.25}};
  const ModelConfig c = model_config_from_hf(v5, "c");
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_EQ(c.rope_dim(), 4);
  // Elsewhere the key is not read, so it is still refused.
  json q = make_tiny(Arch::kQwen3Moe).config;
  q["rope_scaling"] = v5["rope_parameters"];
  const std::string msg = message_of([&] { model_config_from_hf(q, "hf/config.json"); });
  EXPECT_NE(msg.find("partial_rotary_factor"), std::string::npos) << msg;
  // Glm4MoeConfig's head_dim defaults to 128, not hidden_size / num_attention_heads.
  json no_hd = hf;
  no_hd.erase("head_dim");
  EXPECT_EQ(model_config_from_hf(no_hd, "c").head_dim, 128);
  // Token ids outside a shrunk vocabulary (a release's ids kept) are dropped, in-range ones kept.
  json ids = hf;
  ids["bos_token_id"] = 100000;
  ids["eos_token_id"] = json::array({7, 8});
  const ModelConfig ct = model_config_from_hf(ids, "c");
  EXPECT_FALSE(ct.bos_token_id.has_value());
  EXPECT_EQ(ct.eos_token_id, 7);
  EXPECT_NO_THROW(ModelConfig::from_json(ct.to_json(), "model.json"));
}

}  // namespace
