// Implementation of runtime/convert/model_shapes.h. Values checked against each model's config.json on
// the Hugging Face hub (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, mistralai/Mixtral-8x7B-v0.1,
// allenai/OLMoE-1B-7B-0924, Qwen/Qwen2-57B-A14B, zai-org/GLM-4.5-Air, deepseek-ai/DeepSeek-V3,
// moonshotai/Kimi-K2-Instruct, openai/gpt-oss-120b, openai/gpt-oss-20b, MiniMaxAI/MiniMax-M2).
#include "runtime/convert/model_shapes.h"

#include <algorithm>

#include "common/error.h"

namespace moestream {

namespace {

struct Shape {
  const char* name;
  Arch arch;
  ModelSizes sizes;  // vocab, hidden, layers, heads, kv heads, head_dim, expert width, experts,
                     // top-k, max positions
  bool norm_topk_prob;
  double rms_norm_eps, rope_theta;
  QkNorm qk_norm;
  int shared_expert_width = 0;  // Qwen2-MoE's gated shared expert (with QKV biases); 0: none
};

// GLM-4.5-Air (zai-org/GLM-4.5-Air config.json): sigmoid routing over one group, 1 ungated shared
// expert of the expert width, layer 0 a dense MLP of 10944, Q/K/V biases, no QK-norm, RoPE on
// half of each head (partial_rotary_factor 0.5), routed_scaling_factor 1. Its MTP layer is not
// part of the decoder and not written.
ModelConfig glm45_air() {
  ModelConfig c = make_model_config(Arch::kGlm4Moe, {151552, 4096, 46, 96, 8, 128, 1408, 128, 8, 131072},
                                    QkNorm::kNone, QuantType::kQ4);
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  c.qkv_bias = true;
  c.router_scoring = RouterScoring::kSigmoid;
  c.shared_expert_intermediate_size = 1408;
  c.shared_expert_gated = false;
  c.first_k_dense_replace = 1;
  c.intermediate_size = 10944;
  c.rotary_dim = 64;
  return c;
}

// MiniMax-M2 (MiniMaxAI/MiniMax-M2 config.json): 62 layers of 256 experts (top-8) of width 1536,
// 48 query and 8 KV heads of 128 with one RMSNorm over all heads of q and of k, RoPE (theta 5e6) on
// the first 64 dims of each head, sigmoid routing with a correction bias in one group, renormalised
// and unscaled; no shared expert, no dense layer. Its MTP modules are not part of the decoder.
ModelConfig minimax_m2() {
  ModelConfig c = make_model_config(Arch::kMinimaxM2, {200064, 3072, 62, 48, 8, 128, 1536, 256, 8, 196608},
                                    QkNorm::kFull, QuantType::kQ4);
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 5e6;
  c.rotary_dim = 64;
  c.router_scoring = RouterScoring::kSigmoid;
  return c;
}

// DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json) and Kimi K2 (moonshotai/Kimi-K2-Instruct, the
// same architecture): MLA with q LoRA 1536, latent 512, heads of 128 no-RoPE + 64 RoPE dims and
// 128-wide values, YaRN (mscale 1 = mscale_all_dim 1: the softmax scale grows, cos/sin do not);
// sigmoid routing with a correction bias, 1 ungated shared expert of the expert width, dense
// first layers of 18432. Their MTP layer is not part of the decoder and not written.
ModelConfig deepseek_v3_family(bool kimi) {
  // heads = kv heads (every head reads the latent); head_dim = qk_nope + qk_rope.
  const ModelSizes sizes = kimi ? ModelSizes{163840, 7168, 61, 64, 64, 192, 2048, 384, 8, 131072}
                                : ModelSizes{129280, 7168, 61, 128, 128, 192, 2048, 256, 8, 163840};
  ModelConfig c = make_model_config(Arch::kDeepseekV3, sizes, QkNorm::kNone, QuantType::kQ4);
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = kimi ? 50000 : 10000;
  RopeScaling y;
  y.type = "yarn";
  y.factor = kimi ? 32 : 40;
  y.original_max_position_embeddings = 4096;
  y.beta_fast = kimi ? 1 : 32;
  y.beta_slow = 1;
  y.mscale = 1;
  y.mscale_all_dim = 1;
  c.rope_scaling = y;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.router_scoring = RouterScoring::kSigmoid;
  c.n_group = kimi ? 1 : 8;
  c.topk_group = kimi ? 1 : 4;
  c.routed_scaling_factor = kimi ? 2.827 : 2.5;
  c.shared_expert_intermediate_size = 2048;
  c.shared_expert_gated = false;
  c.first_k_dense_replace = kimi ? 1 : 3;
  c.intermediate_size = 18432;
  return c;
}

// Mixtral's router takes the softmax over the top-k logits, which equals renormalised top-k
// probabilities: norm_topk_prob true. OLMoE keeps the raw top-k probabilities.
constexpr Shape kShapes[] = {
    {"qwen3-30b-a3b", Arch::kQwen3Moe, {151936, 2048, 48, 32, 4, 128, 768, 128, 8, 40960}, true, 1e-6,
     1e6, QkNorm::kPerHead},
    {"qwen3-235b-a22b", Arch::kQwen3Moe, {151936, 4096, 94, 64, 4, 128, 1536, 128, 8, 40960}, true,
     1e-6, 1e6, QkNorm::kPerHead},
    {"mixtral-8x7b", Arch::kMixtral, {32000, 4096, 32, 32, 8, 128, 14336, 8, 2, 32768}, true, 1e-5,
     1e6, QkNorm::kNone},
    {"olmoe-1b-7b", Arch::kOlmoe, {50304, 2048, 16, 16, 16, 128, 1024, 64, 8, 4096}, false, 1e-5, 1e4,
     QkNorm::kFull},
    {"qwen2-57b-a14b", Arch::kQwen2Moe, {151936, 3584, 28, 28, 4, 128, 2560, 64, 8, 131072}, false, 1e-6,
     1e6, QkNorm::kNone, 20480},
    // gpt-oss: the rest of its maths (gpt_oss_defaults) is the same for both sizes.
    {"gpt-oss-120b", Arch::kGptOss, {201088, 2880, 36, 64, 8, 64, 2880, 128, 4, 131072}, false, 1e-5, 150000,
     QkNorm::kNone},
    {"gpt-oss-20b", Arch::kGptOss, {201088, 2880, 24, 64, 8, 64, 2880, 32, 4, 131072}, false, 1e-5, 150000,
     QkNorm::kNone},
};

// Both released gpt-oss configs: biases everywhere, sinks, a 128-position window on even layers,
// YaRN x32 from 4096 positions (truncate false), the clamped SwiGLU, MXFP4 experts.
void gpt_oss_defaults(ModelConfig& c) {
  c.qkv_bias = c.o_bias = c.attention_sinks = true;
  c.router_bias = c.router_softmax_topk = c.expert_bias = true;
  c.swiglu_limit = 7.0;
  c.swiglu_alpha = 1.702;
  c.sliding_window = 128;
  set_layer_count(c, c.n_layers);
  RopeScaling y;
  y.type = "yarn";
  y.factor = 32;
  y.original_max_position_embeddings = 4096;
  y.truncate = false;
  c.rope_scaling = y;
  c.expert_quant = ggml_quant(GgmlType::kMXFP4);
}

}  // namespace

std::vector<std::string> known_shape_names() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  names.emplace_back("glm-4.5-air");
  names.emplace_back("deepseek-v3");
  names.emplace_back("kimi-k2");
  names.emplace_back("minimax-m2");
  return names;
}

ModelConfig known_shape(std::string_view name) {
  if (name == "glm-4.5-air") {
    ModelConfig c = glm45_air();
    c.tie_word_embeddings = false;
    c.dense_dtype = "bf16";
    return c;
  }
  if (name == "minimax-m2") {
    ModelConfig c = minimax_m2();
    c.tie_word_embeddings = false;
    c.dense_dtype = "bf16";
    return c;
  }
  if (name == "deepseek-v3" || name == "kimi-k2") {
    ModelConfig c = deepseek_v3_family(name == "kimi-k2");
    c.tie_word_embeddings = false;
    c.dense_dtype = "bf16";
    return c;
  }
  for (const Shape& s : kShapes) {
    if (name != s.name) continue;
    ModelConfig c = make_model_config(s.arch, s.sizes, s.qk_norm, QuantType::kQ4);
    c.norm_topk_prob = s.norm_topk_prob;
    c.rms_norm_eps = s.rms_norm_eps;
    c.rope_theta = s.rope_theta;
    c.tie_word_embeddings = false;
    c.dense_dtype = "bf16";
    c.shared_expert_intermediate_size = s.shared_expert_width;
    c.qkv_bias = s.shared_expert_width > 0;
    if (s.arch == Arch::kGptOss) gpt_oss_defaults(c);
    return c;
  }
  std::string known;
  for (const std::string& s : known_shape_names()) known += std::string(known.empty() ? "" : ", ") + s;
  throw ConfigError("unknown model shape '" + std::string(name) + "' (known: " + known + ")");
}

ModelConfig scaled_down(ModelConfig cfg, int factor) {
  if (factor < 1) throw ConfigError("scale-down factor must be >= 1, got " + std::to_string(factor));
  auto shrink = [factor](int v) { return std::max(32, v / factor); };
  cfg.hidden_size = shrink(cfg.hidden_size);
  cfg.moe_intermediate_size = shrink(cfg.moe_intermediate_size);
  if (cfg.has_shared_expert()) cfg.shared_expert_intermediate_size = shrink(cfg.shared_expert_intermediate_size);
  if (cfg.first_k_dense_replace > 0) cfg.intermediate_size = shrink(cfg.intermediate_size);
  if (cfg.has_mla()) {  // DeepSeek-V3: the LoRA ranks are widths too; head sizes stay
    if (cfg.q_lora_rank > 0) cfg.q_lora_rank = shrink(cfg.q_lora_rank);
    cfg.kv_lora_rank = shrink(cfg.kv_lora_rank);
  }
  cfg.vocab_size = shrink(cfg.vocab_size);
  if (!is_pack_quant(cfg.expert_quant)) {  // ggml blocks (MXFP4): whole 32-element blocks per row
    cfg.hidden_size = cfg.hidden_size / 32 * 32;
    cfg.moe_intermediate_size = cfg.moe_intermediate_size / 32 * 32;
  }
  return cfg;
}

void set_layer_count(ModelConfig& cfg, int layers) {
  cfg.n_layers = layers;
  if (cfg.sliding_window <= 0) return;
  cfg.sliding_layers.clear();
  for (int l = 0; l < layers; ++l) cfg.sliding_layers.push_back(l % 2 == 0);  // gpt-oss's pattern
}

}  // namespace moestream
