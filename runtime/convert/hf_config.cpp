// Implementation of runtime/convert/hf_config.h. Field names and defaults follow transformers'
// Qwen3MoeConfig, OlmoeConfig, MixtralConfig, Qwen2MoeConfig and GptOssConfig (v4.5x and v5, including
// `rope_parameters`).
#include "runtime/convert/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moestream {
namespace {

using nlohmann::json;

[[noreturn]] void unsupported(const std::string& where, const std::string& key, const std::string& why) {
  throw ConfigError(where + ": '" + key + "' " + why + " is not supported by moestream");
}

const json* find(const json& j, const std::string& key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int req_int(const json& j, const std::string& key, const std::string& where) {
  const json* v = find(j, key);
  if (!v) throw FormatError(where + ": missing field '" + key + "'");
  if (!v->is_number_integer() || v->get<long long>() <= 0 || v->get<long long>() > (1LL << 30))
    throw FormatError(where + ": field '" + key + "' must be a positive integer, got " + v->dump());
  return v->get<int>();
}

// The first of `keys` present: transformers renames some fields between versions (v5 saves
// Qwen3-MoE's num_experts as num_local_experts, as Mixtral always did).
int req_int_any(const json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys)
    if (find(j, k)) return req_int(j, k, where);
  return req_int(j, *keys.begin(), where);  // reports the first name as missing
}

int opt_int(const json& j, const std::string& key, const std::string& where, int dflt) {
  return find(j, key) ? req_int(j, key, where) : dflt;
}

// A count that may be 0 (n_shared_experts, first_k_dense_replace).
int opt_count(const json& j, const std::string& key, const std::string& where, int dflt) {
  const json* v = find(j, key);
  if (!v) return dflt;
  if (!v->is_number_integer() || v->get<long long>() < 0 || v->get<long long>() > 4096)
    throw FormatError(where + ": field '" + key + "' must be an integer in [0, 4096], got " + v->dump());
  return v->get<int>();
}

double opt_num(const json& j, const std::string& key, const std::string& where, double dflt) {
  const json* v = find(j, key);
  if (!v) return dflt;
  if (!v->is_number()) throw FormatError(where + ": field '" + key + "' must be a number, got " + v->dump());
  return v->get<double>();
}

bool opt_bool(const json& j, const std::string& key, const std::string& where, bool dflt) {
  const json* v = find(j, key);
  if (!v) return dflt;
  if (!v->is_boolean()) throw FormatError(where + ": field '" + key + "' must be true/false, got " + v->dump());
  return v->get<bool>();
}

std::optional<int> opt_token(const json& j, const std::string& key) {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int>();
  if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int>();  // first of several
  return std::nullopt;
}

Arch detect_arch(const json& hf, const std::string& where) {
  std::string name;
  if (const json* a = find(hf, "architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string())
    name = (*a)[0].get<std::string>();
  else if (const json* t = find(hf, "model_type"); t && t->is_string())
    name = t->get<std::string>();
  if (name == "Qwen3MoeForCausalLM" || name == "qwen3_moe") return Arch::kQwen3Moe;
  if (name == "OlmoeForCausalLM" || name == "olmoe") return Arch::kOlmoe;
  if (name == "MixtralForCausalLM" || name == "mixtral") return Arch::kMixtral;
  if (name == "Qwen2MoeForCausalLM" || name == "qwen2_moe") return Arch::kQwen2Moe;
  if (name == "Glm4MoeForCausalLM" || name == "glm4_moe") return Arch::kGlm4Moe;
  // Kimi K2 ships DeepSeek-V3's architecture (its model_type "kimi_k2" comes second).
  if (name == "DeepseekV3ForCausalLM" || name == "deepseek_v3" || name == "kimi_k2") return Arch::kDeepseekV3;
  if (name == "DeepseekV2ForCausalLM" || name == "deepseek_v2") return Arch::kDeepseekV2;
  if (name == "GptOssForCausalLM" || name == "gpt_oss") return Arch::kGptOss;
  if (name == "MiniMaxM2ForCausalLM" || name == "minimax_m2") return Arch::kMinimaxM2;
  throw ConfigError(where + ": unsupported architecture '" + (name.empty() ? "<none>" : name) +
                    "' (supported: Qwen3MoeForCausalLM, OlmoeForCausalLM, MixtralForCausalLM, "
                    "Qwen2MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM, DeepseekV2ForCausalLM, "
                    "GptOssForCausalLM, MiniMaxM2ForCausalLM)");
}

// transformers v4 keeps `rope_theta` and `rope_scaling`; v5 folds both into `rope_parameters`.
void read_rope(const json& hf, ModelConfig& c, double default_theta, const std::string& where) {
  const json* params = find(hf, "rope_parameters");
  c.rope_theta = opt_num(hf, "rope_theta", where, default_theta);
  if (params && params->is_object()) c.rope_theta = opt_num(*params, "rope_theta", where, c.rope_theta);
  const json* sc = find(hf, "rope_scaling");
  if (!sc && params && params->is_object()) sc = params;
  if (!sc) return;
  if (!sc->is_object()) throw FormatError(where + ": 'rope_scaling' must be an object");
  std::string type;
  if (const json* t = find(*sc, "rope_type")) type = t->get<std::string>();
  else if (const json* t2 = find(*sc, "type")) type = t2->get<std::string>();
  if (type.empty() || type == "default") return;
  if (type != "linear" && type != "dynamic" && type != "yarn" && type != "llama3")
    unsupported(where, "rope_scaling.type", "'" + type + "'");
  static const std::set<std::string> kKnown = {
      "type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
      "low_freq_factor", "high_freq_factor", "rope_theta", "mscale", "mscale_all_dim",
      "truncate"};
  for (auto& [k, v] : sc->items())
    if (!kKnown.count(k) && !v.is_null() &&
        !(k == "partial_rotary_factor" && (c.arch == Arch::kGlm4Moe || c.arch == Arch::kMinimaxM2)))  // read below
      unsupported(where, "rope_scaling." + k, "(changes RoPE)");
  RopeScaling s;
  s.type = type;
  s.factor = opt_num(*sc, "factor", where, 1.0);
  s.original_max_position_embeddings = opt_num(*sc, "original_max_position_embeddings", where, 0);
  s.beta_fast = opt_num(*sc, "beta_fast", where, 32);
  s.beta_slow = opt_num(*sc, "beta_slow", where, 1);
  s.low_freq_factor = opt_num(*sc, "low_freq_factor", where, 1);
  s.high_freq_factor = opt_num(*sc, "high_freq_factor", where, 4);
  if (type == "yarn" && (c.arch == Arch::kDeepseekV3 || c.arch == Arch::kDeepseekV2)) {  // its magnitude scales (rope.h, mla_attention.h)
    s.mscale = opt_num(*sc, "mscale", where, 0);
    s.mscale_all_dim = opt_num(*sc, "mscale_all_dim", where, 0);
  } else if (find(*sc, "mscale") || find(*sc, "mscale_all_dim")) {
    unsupported(where, "rope_scaling.mscale", "(changes RoPE; read for DeepSeek-V2/V3's yarn only)");
  }
  s.truncate = opt_bool(*sc, "truncate", where, true);
  c.rope_scaling = s;
}

// The MoE fields every architecture has, under its own names and defaults.
struct MoeKeys {
  const char* intermediate;
  const char *experts, *experts_alt;  // the architecture's own key first
  double rms_norm_eps, rope_theta;
  QkNorm qk_norm;
};

MoeKeys moe_keys(Arch a) {
  switch (a) {
    case Arch::kQwen3Moe:
      return {"moe_intermediate_size", "num_experts", "num_local_experts", 1e-6, 10000.0, QkNorm::kPerHead};
    case Arch::kQwen2Moe:
      return {"moe_intermediate_size", "num_experts", "num_local_experts", 1e-6, 10000.0, QkNorm::kNone};
    case Arch::kOlmoe:
      return {"intermediate_size", "num_experts", "num_local_experts", 1e-5, 10000.0, QkNorm::kFull};
    case Arch::kGlm4Moe:
      return {"moe_intermediate_size", "n_routed_experts", "num_local_experts", 1e-5, 10000.0, QkNorm::kNone};
    case Arch::kDeepseekV3:
    case Arch::kDeepseekV2:
      return {"moe_intermediate_size", "n_routed_experts", "num_local_experts", 1e-6, 10000.0, QkNorm::kNone};
    case Arch::kGptOss:
      return {"intermediate_size", "num_local_experts", "num_experts", 1e-5, 150000.0, QkNorm::kNone};
    case Arch::kMinimaxM2:  // MiniMaxM2Config: intermediate_size is the expert width
      return {"intermediate_size", "num_local_experts", "num_experts", 1e-6, 5000000.0, QkNorm::kFull};
    case Arch::kMixtral:
      break;
  }
  return {"intermediate_size", "num_local_experts", "num_experts", 1e-5, 1e6, QkNorm::kNone};
}

// Glm4MoeForCausalLM (GLM-4.5, 4.5-Air, 4.6), after the fields every architecture shares:
// grouped sigmoid routing, ungated shared experts, dense first layers, partial rotary, QK-norm
// and Q/K/V biases as the config says. The MTP layers (num_nextn_predict_layers) sit after the
// last decoder layer; the converter skips their weights (decoding does not use them).
// The MoE fields GLM-4.5 and DeepSeek-V3 share (grouped sigmoid routing, ungated shared experts,
// dense first layers), with the defaults of each architecture's transformers config.
struct GroupedMoeDefaults {
  int n_group, topk_group;
  double routed_scaling_factor;
  int first_k_dense_replace;
};
void read_grouped_sigmoid_moe(const json& hf, ModelConfig& c, const std::string& where, GroupedMoeDefaults d) {
  c.norm_topk_prob = opt_bool(hf, "norm_topk_prob", where, true);
  c.router_scoring = RouterScoring::kSigmoid;
  c.n_group = opt_int(hf, "n_group", where, d.n_group);
  c.topk_group = opt_int(hf, "topk_group", where, d.topk_group);
  c.routed_scaling_factor = opt_num(hf, "routed_scaling_factor", where, d.routed_scaling_factor);
  if (!(c.routed_scaling_factor > 0)) throw FormatError(where + ": 'routed_scaling_factor' must be positive");
  if (c.n_experts % c.n_group != 0 || c.topk_group > c.n_group || (c.n_group > 1 && c.n_experts / c.n_group < 2))
    throw ConfigError(where + ": n_group " + std::to_string(c.n_group) + " / topk_group " +
                      std::to_string(c.topk_group) + " do not split " + std::to_string(c.n_experts) +
                      " experts into groups of at least 2");
  if (c.topk_group * (c.n_experts / c.n_group) < c.n_experts_per_tok)
    throw ConfigError(where + ": topk_group groups hold fewer experts than num_experts_per_tok");
  const int64_t shared = int64_t(opt_count(hf, "n_shared_experts", where, 1)) * c.moe_intermediate_size;
  if (shared > (int64_t(1) << 30)) throw FormatError(where + ": n_shared_experts x moe_intermediate_size exceeds 2^30");
  c.shared_expert_intermediate_size = int(shared);
  c.shared_expert_gated = false;
  c.first_k_dense_replace = opt_count(hf, "first_k_dense_replace", where, d.first_k_dense_replace);
  if (c.first_k_dense_replace >= c.n_layers)
    throw ConfigError(where + ": first_k_dense_replace " + std::to_string(c.first_k_dense_replace) +
                      " leaves no MoE layer of " + std::to_string(c.n_layers));
  if (c.first_k_dense_replace > 0) c.intermediate_size = req_int(hf, "intermediate_size", where);
}

void read_glm4_moe(const json& hf, ModelConfig& c, const std::string& where) {
  c.qkv_bias = opt_bool(hf, "attention_bias", where, false);
  if (opt_bool(hf, "use_qk_norm", where, false)) c.qk_norm = QkNorm::kPerHead;
  read_grouped_sigmoid_moe(hf, c, where, {1, 1, 1.0, 1});
  // transformers 5 keeps partial_rotary_factor in rope_parameters, 4.5x at the top level.
  double factor = opt_num(hf, "partial_rotary_factor", where, 0.5);
  if (const json* rp = find(hf, "rope_parameters"); rp && rp->is_object())
    factor = opt_num(*rp, "partial_rotary_factor", where, factor);
  if (!(factor > 0 && factor <= 1)) throw FormatError(where + ": 'partial_rotary_factor' must be in (0, 1]");
  c.rotary_dim = int(c.head_dim * factor);  // int(), as transformers
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    throw ConfigError(where + ": partial_rotary_factor " + std::to_string(factor) + " x head_dim " +
                      std::to_string(c.head_dim) + " is not an even rotary width");
}

// The partial rotary width as transformers 5 resolves it: rope_parameters' (or rope_scaling's)
// partial_rotary_factor, else the top-level one, else rotary_dim / head_dim (MiniMax-M2's released
// key), else 1; the width is int(head_dim * factor), which must be even.
void read_partial_rotary(const json& hf, ModelConfig& c, const std::string& where) {
  double factor = 1.0;
  if (const json* r = find(hf, "rotary_dim")) {
    if (!r->is_number_integer() || r->get<long long>() <= 0 || r->get<long long>() > c.head_dim)
      throw FormatError(where + ": field 'rotary_dim' must be an integer in [1, head_dim " +
                        std::to_string(c.head_dim) + "], got " + r->dump());
    factor = double(r->get<int>()) / double(c.head_dim);
  }
  factor = opt_num(hf, "partial_rotary_factor", where, factor);
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (const json* rp = find(hf, key); rp && rp->is_object())
      factor = opt_num(*rp, "partial_rotary_factor", where, factor);
  if (!(factor > 0 && factor <= 1)) throw FormatError(where + ": 'partial_rotary_factor' must be in (0, 1]");
  c.rotary_dim = int(c.head_dim * factor);  // int(), as transformers
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    throw ConfigError(where + ": a rotary width of " + std::to_string(c.rotary_dim) + " of head_dim " +
                      std::to_string(c.head_dim) + " is not even");
  if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;  // whole heads
}

// MiniMaxM2ForCausalLM as transformers 5.23 computes it (modeling_minimax_m2.py): q_norm and k_norm
// over all heads' projections before the head split, partial rotary, a sigmoid router whose
// e_score_correction_bias joins the scores for selection only, the chosen sigmoid scores divided by
// their sum (no groups, no scaling), no shared expert, every layer full softmax attention. The
// released config.json also carries keys the original remote code read and transformers does not:
// each must state what transformers computes, or the model is refused naming the key.
void read_minimax_m2(const json& hf, ModelConfig& c, const std::string& where) {
  auto require = [&](const char* key, const json& want, const std::string& why) {
    if (const json* v = find(hf, key); v && *v != want) unsupported(where, key, v->dump() + " " + why);
  };
  require("use_qk_norm", true, "(transformers always normalises q and k)");
  require("qk_norm_type", "per_layer", "(transformers normalises over all heads)");
  require("scoring_func", "sigmoid", "(transformers' MiniMax-M2 router is sigmoid)");
  require("use_routing_bias", true, "(transformers always adds e_score_correction_bias)");
  if (opt_count(hf, "shared_intermediate_size", where, 0) != 0)
    unsupported(where, "shared_intermediate_size", "(shared experts)");
  if (const json* t = find(hf, "attn_type_list")) {
    if (!t->is_array() || t->size() < size_t(c.n_layers))
      throw FormatError(where + ": 'attn_type_list' must be an array of at least num_hidden_layers integers");
    for (int l = 0; l < c.n_layers; ++l)
      if ((*t)[size_t(l)] != 1)
        unsupported(where, "attn_type_list",
                    "entry " + std::to_string(l) + " = " + (*t)[size_t(l)].dump() +
                        " (1 is softmax attention; others are MiniMax-01's lightning attention)");
  }
  c.norm_topk_prob = true;
  c.router_scoring = RouterScoring::kSigmoid;
  c.n_group = c.topk_group = 1;
  c.routed_scaling_factor = 1.0;
  read_partial_rotary(hf, c, where);
}

// DeepSeek-V2's group_limited_greedy (issue 20): n_group groups (null or absent: 1) of which
// topk_group (null or absent: 1) compete; the groups must split the experts evenly and hold k.
void read_group_limited_greedy(const json& hf, ModelConfig& c, const std::string& where) {
  c.n_group = opt_int(hf, "n_group", where, 1);
  c.topk_group = opt_int(hf, "topk_group", where, 1);
  if (c.n_experts % c.n_group != 0 || c.topk_group > c.n_group)
    throw ConfigError(where + ": topk_method group_limited_greedy with n_group " + std::to_string(c.n_group) +
                      " / topk_group " + std::to_string(c.topk_group) + " does not split " +
                      std::to_string(c.n_experts) + " experts into groups");
  if (int64_t(c.topk_group) * (c.n_experts / c.n_group) < c.n_experts_per_tok)
    throw ConfigError(where + ": topk_method group_limited_greedy: topk_group " + std::to_string(c.topk_group) + " groups of " +
                      std::to_string(c.n_experts / c.n_group) + " experts hold fewer than num_experts_per_tok " +
                      std::to_string(c.n_experts_per_tok));
}

// DeepSeek-V2(-Lite)'s MoE as transformers' DeepseekV2 computes it: softmax over all experts, the
// top-k probabilities as they are (norm_topk_prob is not read there), ungated shared experts, dense
// first layers. topk_method "group_limited_greedy" (DeepSeek-V2 236B) keeps the topk_group groups
// of best maximum probability (routing.h route_softmax_grouped); routed_scaling_factor multiplies
// the weights with either method.
void read_deepseek_v2_moe(const json& hf, ModelConfig& c, const std::string& where) {
  if (const json* f = find(hf, "scoring_func"); f && *f != "softmax") unsupported(where, "scoring_func", f->dump());
  const json* m = find(hf, "topk_method");
  if (m && *m != "greedy" && *m != "group_limited_greedy") unsupported(where, "topk_method", m->dump());
  if (m && *m == "group_limited_greedy") read_group_limited_greedy(hf, c, where);
  c.routed_scaling_factor = opt_num(hf, "routed_scaling_factor", where, 1.0);
  if (!(c.routed_scaling_factor > 0 && std::isfinite(c.routed_scaling_factor)))
    throw FormatError(where + ": 'routed_scaling_factor' must be positive and finite");
  c.norm_topk_prob = false;
  c.router_scoring = RouterScoring::kSoftmax;
  const int64_t shared = int64_t(opt_count(hf, "n_shared_experts", where, 2)) * c.moe_intermediate_size;
  if (shared > (int64_t(1) << 30)) throw FormatError(where + ": n_shared_experts x moe_intermediate_size exceeds 2^30");
  c.shared_expert_intermediate_size = int(shared);
  c.shared_expert_gated = false;
  c.first_k_dense_replace = opt_count(hf, "first_k_dense_replace", where, 0);
  if (c.first_k_dense_replace >= c.n_layers)
    throw ConfigError(where + ": first_k_dense_replace " + std::to_string(c.first_k_dense_replace) +
                      " leaves no MoE layer of " + std::to_string(c.n_layers));
  if (c.first_k_dense_replace > 0) c.intermediate_size = req_int(hf, "intermediate_size", where);
}

// DeepSeek-V2/V3's multi-head latent attention sizes; q_lora_rank null means a plain q_proj.
void read_mla_fields(const json& hf, ModelConfig& c, const std::string& where) {
  c.q_lora_rank = opt_int(hf, "q_lora_rank", where, 0);
  c.kv_lora_rank = req_int(hf, "kv_lora_rank", where);
  c.qk_nope_head_dim = req_int(hf, "qk_nope_head_dim", where);
  c.qk_rope_head_dim = req_int(hf, "qk_rope_head_dim", where);
  c.v_head_dim = req_int(hf, "v_head_dim", where);
  if (c.qk_rope_head_dim % 2 != 0) throw FormatError(where + ": 'qk_rope_head_dim' must be even");
  c.n_kv_heads = c.n_heads;  // every head reads the one latent
  // moe_layer_freq: transformers ignores it; convert.cpp checks the tensors agree (sweep-a).
  opt_int(hf, "moe_layer_freq", where, 1);
  if (c.arch == Arch::kDeepseekV2) {
    read_deepseek_v2_moe(hf, c, where);
    return;
  }
  // DeepSeek-V3's router: sigmoid scores, bias-corrected grouped top-k.
  if (const json* f = find(hf, "scoring_func"); f && *f != "sigmoid") unsupported(where, "scoring_func", f->dump());
  if (const json* m = find(hf, "topk_method"); m && *m != "noaux_tc") unsupported(where, "topk_method", m->dump());
  read_grouped_sigmoid_moe(hf, c, where, {8, 4, 2.5, 3});  // DeepseekV3Config's defaults
}

// GptOssConfig: biases everywhere, sinks, alternating sliding windows, the clamped SwiGLU and a
// softmax over the selected router logits (transformers' modeling_gpt_oss.py).
void read_gpt_oss(const json& hf, ModelConfig& c, const std::string& where) {
  c.norm_topk_prob = false;  // the top-k softmax already sums to 1
  c.router_softmax_topk = true;
  c.router_bias = true;
  c.expert_bias = true;
  c.attention_sinks = true;
  // attention_bias (default true, as released) gives q/k/v and o_proj biases together.
  c.qkv_bias = c.o_bias = opt_bool(hf, "attention_bias", where, true);
  c.swiglu_limit = opt_num(hf, "swiglu_limit", where, 7.0);
  c.swiglu_alpha = opt_num(hf, "swiglu_alpha", where, 1.702);
  if (!(c.swiglu_limit > 0)) unsupported(where, "swiglu_limit", std::to_string(c.swiglu_limit) + " (<= 0)");
  c.sliding_window = opt_int(hf, "sliding_window", where, 128);
  if (const json* lt = find(hf, "layer_types")) {
    if (!lt->is_array() || lt->size() != size_t(c.n_layers))
      throw FormatError(where + ": 'layer_types' must be an array of num_hidden_layers strings");
    for (const json& t : *lt) {
      if (t != "sliding_attention" && t != "full_attention") unsupported(where, "layer_types", t.dump());
      c.sliding_layers.push_back(t == "sliding_attention");
    }
  } else {  // transformers' default: even layers slide, odd ones see everything
    for (int l = 0; l < c.n_layers; ++l) c.sliding_layers.push_back(l % 2 == 0);
  }
}

// Qwen2-MoE's layer kinds as transformers' Qwen2MoeDecoderLayer picks them: layer l has a dense
// MLP of intermediate_size when l is in mlp_only_layers or (l + 1) % decoder_sparse_step != 0.
// The pack numbers MoE layers after leading dense ones (first_k_dense_replace), so only dense layers
// before the first MoE layer are representable: others are refused, naming both fields.
// Sliding windows: use_sliding_window true, sliding_window the width, layer_types which layers
// (absent: transformers 5's default, even layers below max_window_layers).
void read_qwen2_moe_layers(const json& hf, ModelConfig& c, const std::string& where) {
  c.qkv_bias = opt_bool(hf, "qkv_bias", where, true);  // released configs predate the key
  c.shared_expert_intermediate_size = req_int(hf, "shared_expert_intermediate_size", where);
  const int step = opt_int(hf, "decoder_sparse_step", where, 1);
  std::vector<bool> dense(size_t(c.n_layers), false);
  for (int l = 0; l < c.n_layers; ++l) dense[size_t(l)] = (l + 1) % step != 0;
  if (const json* m = find(hf, "mlp_only_layers")) {
    if (!m->is_array()) throw FormatError(where + ": 'mlp_only_layers' must be an array of layer indices");
    for (const json& v : *m) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= c.n_layers)
        throw FormatError(where + ": 'mlp_only_layers' holds " + v.dump() + ", not a layer index below " +
                          std::to_string(c.n_layers));
      dense[size_t(v.get<int>())] = true;
    }
  }
  int lead = 0;
  while (lead < c.n_layers && dense[size_t(lead)]) ++lead;
  if (lead == c.n_layers)
    unsupported(where, "mlp_only_layers", "/ 'decoder_sparse_step' " + std::to_string(step) +
                                              " leaving no MoE layer (a dense model)");
  for (int l = lead; l < c.n_layers; ++l)
    if (dense[size_t(l)])
      unsupported(where, "mlp_only_layers", "/ 'decoder_sparse_step' " + std::to_string(step) + " with dense layer " +
                                                std::to_string(l) + " after MoE layer " + std::to_string(lead) +
                                                " (only leading dense layers)");
  c.first_k_dense_replace = lead;
  if (lead > 0) c.intermediate_size = req_int(hf, "intermediate_size", where);

  const json* lt = find(hf, "layer_types");
  std::vector<bool> sliding(size_t(c.n_layers), false);
  if (lt) {
    if (!lt->is_array() || lt->size() != size_t(c.n_layers))
      throw FormatError(where + ": 'layer_types' must be an array of num_hidden_layers strings");
    for (size_t l = 0; l < lt->size(); ++l) {
      const json& t = (*lt)[l];
      if (t != "sliding_attention" && t != "full_attention") unsupported(where, "layer_types", t.dump());
      sliding[l] = t == "sliding_attention";
    }
  }
  const bool use = opt_bool(hf, "use_sliding_window", where, false);
  if (!use) {
    for (bool s : sliding)
      if (s) unsupported(where, "layer_types", "\"sliding_attention\" with use_sliding_window false");
    return;
  }
  if (!lt) {
    const int max_window_layers = opt_count(hf, "max_window_layers", where, 28);
    for (int l = 0; l < c.n_layers; ++l) sliding[size_t(l)] = l % 2 == 0 && l < max_window_layers;
  }
  if (std::find(sliding.begin(), sliding.end(), true) == sliding.end()) return;  // no layer slides
  c.sliding_window = req_int(hf, "sliding_window", where);
  c.sliding_layers = sliding;
}

}  // namespace

ModelConfig model_config_from_hf(const json& hf, const std::string& where) {
  if (!hf.is_object()) throw FormatError(where + ": expected a JSON object");
  ModelConfig c;
  c.arch = detect_arch(hf, where);
  c.vocab_size = req_int(hf, "vocab_size", where);
  c.hidden_size = req_int(hf, "hidden_size", where);
  c.n_layers = req_int(hf, "num_hidden_layers", where);
  c.n_heads = req_int(hf, "num_attention_heads", where);
  c.n_kv_heads = opt_int(hf, "num_key_value_heads", where, c.n_heads);
  c.max_position_embeddings = req_int(hf, "max_position_embeddings", where);
  c.tie_word_embeddings = opt_bool(hf, "tie_word_embeddings", where, false);
  c.bos_token_id = opt_token(hf, "bos_token_id");
  c.eos_token_id = opt_token(hf, "eos_token_id");
  // An id outside the vocabulary (a shrunk test model keeping its release's ids) is never produced
  // nor read by transformers; model.json refuses it, so it is dropped here (sweep-a).
  for (std::optional<int>* t : {&c.bos_token_id, &c.eos_token_id})
    if (*t && (**t < 0 || **t >= c.vocab_size)) t->reset();
  if (const json* act = find(hf, "hidden_act"); act && *act != "silu")
    unsupported(where, "hidden_act", act->dump());
  if (c.arch != Arch::kGlm4Moe && c.arch != Arch::kGptOss && opt_bool(hf, "attention_bias", where, false))
    unsupported(where, "attention_bias", "true");
  if (opt_bool(hf, "mlp_bias", where, false)) unsupported(where, "mlp_bias", "true");
  // Shared experts add a dense expert to every token: Qwen2-MoE's gated one is implemented,
  // DeepSeek's are not.
  for (const char* k : {"shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"})
    if (const json* v = find(hf, k); v && !(v->is_number() && v->get<double>() == 0) &&
                                      !(c.arch == Arch::kQwen2Moe && std::string(k) == "shared_expert_intermediate_size") &&
                                      !((c.arch == Arch::kGlm4Moe || c.arch == Arch::kDeepseekV3 ||
                                         c.arch == Arch::kDeepseekV2) &&
                                        std::string(k) == "n_shared_experts"))
      unsupported(where, k, "(shared experts)");

  const MoeKeys k = moe_keys(c.arch);
  c.moe_intermediate_size = req_int(hf, k.intermediate, where);
  c.n_experts = req_int_any(hf, {k.experts, k.experts_alt}, where);
  c.n_experts_per_tok = req_int(hf, "num_experts_per_tok", where);
  // Mixtral renormalises the top-k weights by construction.
  c.norm_topk_prob = c.arch == Arch::kMixtral || opt_bool(hf, "norm_topk_prob", where, false);  // MiniMax-M2: below
  c.rms_norm_eps = opt_num(hf, "rms_norm_eps", where, k.rms_norm_eps);
  c.qk_norm = k.qk_norm;
  read_rope(hf, c, k.rope_theta, where);
  switch (c.arch) {
    case Arch::kQwen3Moe:
    case Arch::kQwen2Moe:
      if (c.arch == Arch::kQwen2Moe) {  // leading dense layers and sliding windows (sweep-b)
        read_qwen2_moe_layers(hf, c, where);
        break;
      }
      // Both place a dense MLP instead of the MoE block on these layers; every released
      // Qwen1.5-MoE / Qwen2-MoE / Qwen3-MoE model has none.
      if (opt_int(hf, "decoder_sparse_step", where, 1) != 1)
        unsupported(where, "decoder_sparse_step", "!= 1 (dense MLP layers)");
      if (const json* m = find(hf, "mlp_only_layers"); m && !(m->is_array() && m->empty()))
        unsupported(where, "mlp_only_layers", m->dump() + " (dense MLP layers)");
      if (opt_bool(hf, "use_sliding_window", where, false)) unsupported(where, "use_sliding_window", "true");
      if (const json* lt = find(hf, "layer_types")) {  // transformers 5 spells the window per layer
        if (!lt->is_array()) throw FormatError(where + ": 'layer_types' must be an array");
        for (const json& t : *lt)
          if (t != "full_attention") unsupported(where, "layer_types", t.dump() + " (sliding-window attention)");
      }
      if (c.arch == Arch::kQwen2Moe) {
        // Released Qwen2-MoE configs predate the key: transformers' default is true.
        c.qkv_bias = opt_bool(hf, "qkv_bias", where, true);
        c.shared_expert_intermediate_size = req_int(hf, "shared_expert_intermediate_size", where);
      }
      break;
    case Arch::kOlmoe:
      if (const json* v = find(hf, "clip_qkv")) unsupported(where, "clip_qkv", v->dump());
      break;
    case Arch::kGptOss:
      read_gpt_oss(hf, c, where);
      break;
    case Arch::kGlm4Moe:
    case Arch::kMinimaxM2:
      break;  // after head_dim, below
    case Arch::kDeepseekV3:
    case Arch::kDeepseekV2:
      read_mla_fields(hf, c, where);
      break;
    case Arch::kMixtral:
      // A window at least as long as the context never masks anything.
      if (const json* w = find(hf, "sliding_window");
          w && !(w->is_number_integer() && w->get<long long>() >= c.max_position_embeddings))
        unsupported(where, "sliding_window", w->dump() + " (< max_position_embeddings)");
      break;
  }
  // Glm4MoeConfig's and MiniMaxM2Config's head_dim default to 128, not hidden / heads (as transformers).
  const bool head_128 = c.arch == Arch::kGlm4Moe || c.arch == Arch::kMinimaxM2;
  c.head_dim = opt_int(hf, "head_dim", where, head_128 ? 128 : c.hidden_size / c.n_heads);
  if (c.arch == Arch::kGlm4Moe) read_glm4_moe(hf, c, where);
  if (c.arch == Arch::kMinimaxM2) read_minimax_m2(hf, c, where);
  // MLA's query/key head (transformers' DeepseekV3Config saves head_dim as the RoPE part only).
  if (c.has_mla()) c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (c.n_heads % c.n_kv_heads != 0)
    throw ConfigError(where + ": num_key_value_heads " + std::to_string(c.n_kv_heads) +
                      " does not divide num_attention_heads " + std::to_string(c.n_heads));
  if (c.n_experts_per_tok > c.n_experts)
    throw ConfigError(where + ": num_experts_per_tok exceeds the number of experts");
  return c;
}

}  // namespace moestream
