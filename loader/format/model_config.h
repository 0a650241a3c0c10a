// The architecture description of a packed model: `model.json` in the model directory.
// Written by convert_model (from a Hugging Face config.json), read by every runtime component.
//
// model.json (keys, all required unless marked optional):
//   format: "moestream", format_version: 1, or 2 when the pack holds ggml block types (below)
//   architecture: "qwen3_moe" | "olmoe" | "mixtral" | "qwen2_moe" | "glm4_moe" | "deepseek_v3" |
//     "deepseek_v2" | "gpt_oss" | "minimax_m2"
//   vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim,
//   moe_intermediate_size, n_experts, n_experts_per_tok            (positive integers)
//   norm_topk_prob (bool), rms_norm_eps (number), max_position_embeddings (int)
//   qk_norm: "none" | "per_head" (Qwen3: RMSNorm over head_dim) | "full" (OLMoE: over all heads)
//   rope: { theta: number, scaling: null | { type: "linear"|"dynamic"|"yarn"|"llama3", factor, ... } }
//          (yarn: optional truncate, default true: floor/ceil the correction range; gpt-oss false)
//   tie_word_embeddings (bool)
//   qkv_bias (bool, optional, default false): Q, K and V projections add a bias (Qwen2-MoE)
//   shared_expert_intermediate_size (int >= 0, optional, default 0 = none): a dense SwiGLU
//     expert every token runs, scaled by sigmoid(shared_expert_gate . x) (Qwen2-MoE)
//   gpt-oss (all optional, written only when used; defaults change nothing):
//   attention_sinks (bool): a learned logit per head (layers.N.sinks [H]) joins each softmax's
//     denominator; o_bias (bool): the output projection adds layers.N.bo [D];
//   sliding_window (int >= 0) and layer_types (n_layers x "sliding_attention"|"full_attention"):
//     a sliding layer's query sees only the last sliding_window positions (itself included);
//   router_bias (bool): layers.N.router_bias [E] joins the router logits; router_softmax_topk
//     (bool): softmax over the k selected logits instead of over all experts;
//   swiglu: { limit, alpha } (limit > 0): gate = min(gate, limit), up = clamp(up, +-limit),
//     act = (up + 1) * gate * sigmoid(alpha * gate); experts.bias (bool, format_version 2):
//     each expert payload ends with f32 gate/up/down biases (expert_file.h)
//   GLM-4.5 / DeepSeek-V3 (all optional; absent: the values that leave other models unchanged):
//   router_scoring: "softmax" (default) | "sigmoid": sigmoid scores, selection on scores plus
//     layers.N.router_bias (e_score_correction_bias, selection only), group-limited top-k
//   n_group (int >= 1, default 1), topk_group (int in [1, n_group], default 1): experts split into
//     n_group equal groups; a group scores the sum of its two best biased scores; the topk_group
//     best groups' experts compete for the top-k. With router_scoring "softmax" (DeepSeek-V2's
//     group_limited_greedy): a group scores its best softmax probability (not with router_softmax_topk)
//   routed_scaling_factor (number > 0, default 1): multiplies the routed experts' weights
//   shared_expert_gated (bool, default true): false = the shared expert is added unscaled
//     (GLM-4.5, DeepSeek-V3: n_shared_experts x moe_intermediate_size, no shared_expert_gate)
//   first_k_dense_replace (int in [0, n_layers), default 0): layers below it have a dense SwiGLU
//     MLP of intermediate_size (int, required then) instead of experts. Expert files, maps,
//     routing logs and caches number only the MoE layers: MoE layer m is decoder layer
//     first_k_dense_replace + m (experts.layer_types has one entry per MoE layer)
//   rotary_dim (even int in [2, head_dim], default head_dim): RoPE turns the first rotary_dim
//     dims of each head (rotate-half within them), the rest pass (GLM's partial_rotary_factor)
//   mla (deepseek_v3 and deepseek_v2 only, required there): { q_lora_rank (int >= 0, 0 = plain wq), kv_lora_rank,
//     qk_nope_head_dim, qk_rope_head_dim, v_head_dim (positive) }, head_dim = qk_nope + qk_rope;
//     rope.scaling (yarn) may carry mscale and mscale_all_dim (docs/format.md)
//   dense: { file: "dense.safetensors", dtype: "f32"|"bf16" }
//          version 2 also: { file: "dense.gguf", dtype: "gguf" } (each tensor in its ggml type)
//   experts: { dir: "experts", quant: "f32"|"bf16"|"q8"|"q4" }
//          version 2 also: quant a ggml type name ("Q4_K"), and optional layer_types: one
//          [gate, up, down] triple of type names per layer (layer 0's gate equal to quant)
//   tokenizer: { file: "tokenizer.json" | null, config: "tokenizer_config.json" | null }  (optional)
//   bos_token_id, eos_token_id: int in [0, vocab_size) or null (optional)
// Paths (dense.file, experts.dir, tokenizer.*) are relative and stay inside the model directory;
// products of sizes that make up a buffer are bounded (docs/format.md) so none can overflow.
//   source: { ... } free-form provenance written by the converter (optional)
//
// dense.safetensors holds, by these names (W is [out, in]):
//   embed [V, D]; final_norm [D]; lm_head [V, D] (absent when tie_word_embeddings)
//   layers.N.attn_norm [D]; layers.N.wq [H*hd, D]; layers.N.wk [KV*hd, D]; layers.N.wv [KV*hd, D];
//   layers.N.wo [D, H*hd]; layers.N.q_norm, layers.N.k_norm ([hd] per_head, [H*hd]/[KV*hd] full);
//   layers.N.ffn_norm [D]; layers.N.router [E, D]; optional by the flags above: layers.N.bq/bk/bv,
//   layers.N.bo [D], layers.N.sinks [H], layers.N.router_bias [E] (gpt-oss router_bias)
//   sigmoid routing: layers.N.router_bias [E] (float32, as the router)
//   dense-MLP layers (N < first_k_dense_replace): layers.N.mlp_gate [I, D], layers.N.mlp_up [I, D],
//   layers.N.mlp_down [D, I] instead of router, router_bias and shared expert (I = intermediate_size)
// MLA layers (deepseek_v3) hold, instead of wq/wk/wv (r = qk_rope_head_dim, n = qk_nope_head_dim,
// v = v_head_dim, C = kv_lora_rank, Q = q_lora_rank): layers.N.wq_a [Q, D], layers.N.q_a_norm [Q],
//   layers.N.wq_b [H*(n+r), Q] (or layers.N.wq [H*(n+r), D] when Q = 0), layers.N.wkv_a [C+r, D],
//   layers.N.kv_a_norm [C], layers.N.wkv_b [H*(n+v), C], layers.N.wo [D, H*v]. Each head's query
//   rows are n no-RoPE then r RoPE rows, wkv_a's C latent then r RoPE rows, wkv_b's per head n key
//   then v value rows; RoPE rows in rotate-half order (the converter de-interleaves DeepSeek's).
// dense.gguf (dense.dtype "gguf") holds the same tensors by the same names as GGUF tensors (ne0
// first: a [rows, cols] matrix is ne = [cols, rows]), each in its ggml type, Q/K rows in the
// engine's order; its metadata may carry the tokenizer (tokenizer.ggml.*, tokenizer.chat_template),
// which model.json then names as tokenizer.file.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loader/format/expert_file.h"

namespace moestream {

enum class Arch { kQwen3Moe, kOlmoe, kMixtral, kQwen2Moe, kGlm4Moe,
  kDeepseekV3,  // DeepSeek-V3, Kimi K2: multi-head latent attention (MLA)
  kDeepseekV2,  // DeepSeek-V2(-Lite): MLA with a softmax router
  kGptOss,
  kMinimaxM2,  // MiniMax-M2: full-width QK-norm, partial rotary, sigmoid router with correction bias
};
// Where a model's weights are: a packed directory (model.json, dense.safetensors, experts/) or a
// GGUF file (or split set) run in place (loader/format/gguf_model.h).
enum class ModelFormat { kPack, kGguf };
enum class QkNorm { kNone, kPerHead, kFull };
// How router logits become scores (GLM-4.5 / DeepSeek-V3 use sigmoid with group-limited top-k).
enum class RouterScoring { kSoftmax, kSigmoid };

struct RopeScaling {
  std::string type;  // "linear", "dynamic", "yarn", "llama3"
  double factor = 1.0;
  // yarn / llama3 parameters, when present in the source config
  double original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;          // yarn
  bool truncate = true;  // yarn: floor/ceil the correction range (transformers' default; gpt-oss: false)
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  // yarn, DeepSeek: cos/sin scale mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
  // both are set (else 0.1 ln(factor) + 1), and MLA's softmax scale times
  // mscale(factor, mscale_all_dim)^2; 0 = absent. mscale(s, m) = 0.1 m ln(s) + 1 for s > 1.
  double mscale = 0, mscale_all_dim = 0;
};

struct ModelConfig {
  ModelFormat format = ModelFormat::kPack;
  Arch arch = Arch::kQwen3Moe;
  int vocab_size = 0, hidden_size = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int moe_intermediate_size = 0, n_experts = 0, n_experts_per_tok = 0;
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  int max_position_embeddings = 0;
  QkNorm qk_norm = QkNorm::kNone;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  int shared_expert_intermediate_size = 0;  // 0: no shared expert
  // DeepSeek-V2/V3 multi-head latent attention (kDeepseekV3); kv_lora_rank 0: standard attention.
  // head_dim is then the query/key head width qk_nope_head_dim + qk_rope_head_dim.
  int q_lora_rank = 0;  // 0: a plain query projection wq
  int kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // gpt-oss (model.json keys above); the defaults are every other architecture's maths.
  bool attention_sinks = false;
  bool o_bias = false;
  int sliding_window = 0;            // 0: no sliding layers
  std::vector<bool> sliding_layers;  // per layer, true = sliding_attention; empty: all full
  bool router_bias = false;
  bool router_softmax_topk = false;
  bool expert_bias = false;
  double swiglu_limit = 0;  // 0: plain SwiGLU
  double swiglu_alpha = 1.702;
  std::string dense_file = "dense.safetensors";
  std::string dense_dtype = "f32";
  // XXH3-64 of the whole dense file, 16 lowercase hex digits (loader/format/dense_checksum.h);
  // empty: none recorded (packs written before it; GGUF models).
  std::string dense_xxh3;
  std::string experts_dir = "experts";
  QuantType expert_quant = QuantType::kF32;
  // Per layer, when the experts' types differ between layers or between gate, up and down (a
  // GGUF's, or a pack converted from one: model.json's experts.layer_types); empty: every layer's
  // three matrices are expert_quant.
  std::vector<ExpertTypes> layer_expert_types;
  std::string tokenizer_file;         // empty when the model ships none
  std::string tokenizer_config_file;  // empty when absent
  std::optional<int> bos_token_id, eos_token_id;
  // GLM-4.5 / DeepSeek-V3 (model.json keys above): grouped sigmoid routing, an ungated shared
  // expert, dense first layers, partial rotary.
  RouterScoring router_scoring = RouterScoring::kSoftmax;
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool shared_expert_gated = true;
  int first_k_dense_replace = 0;
  int intermediate_size = 0;  // the dense MLP's width (first_k_dense_replace > 0)
  int rotary_dim = 0;         // 0: head_dim

  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  bool has_mla() const { return kv_lora_rank > 0; }
  // The keys a query at a sliding layer may see (0: all, a full-attention layer).
  int window_of(int layer) const {
    return sliding_window > 0 && size_t(layer) < sliding_layers.size() && sliding_layers[size_t(layer)] ? sliding_window
                                                                                                   : 0;
  }
  // Layers with experts: decoder layers first_k_dense_replace.. n_layers-1, numbered 0.. by every
  // expert consumer (files, maps, stores, caches, routing logs).
  int n_moe_layers() const { return n_layers - first_k_dense_replace; }
  bool is_moe_layer(int layer) const { return layer >= first_k_dense_replace; }
  int moe_layer_index(int layer) const { return layer - first_k_dense_replace; }
  int rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  // The encodings and byte layout of MoE layer `layer`'s experts (an MoE layer index).
  ExpertLayout expert_layout(int layer) const;
  // The largest expert payload of any layer (host-cache slots, read buffers).
  size_t max_expert_bytes() const;

  // Reads and validates `dir/model.json`, or the GGUF when `dir` is a GGUF file (GgufModel);
  // throws FormatError/ConfigError naming file and field. For a pack, also checks the files it
  // names with check_model_file (symlinks resolved).
  static ModelConfig load(const std::filesystem::path& dir);
  // Writes `dir/model.json` atomically.
  void save(const std::filesystem::path& dir) const;
  nlohmann::json to_json() const;
  // True when model.json must say format_version 2 (ggml types, per-layer types, a GGUF dense file).
  bool needs_typed_format() const;
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
};

std::string_view arch_name(Arch a);

// What every front end checks first of a -m argument: IoError "model X does not exist", "model X
// is <what it is>: neither a packed model directory nor a GGUF file" (a FIFO, a device, an empty
// file, other magic: probe_model_path), or the errno of a path that cannot be examined.
void require_model_location(const std::filesystem::path& model);

// The sizes a model is made of, in ModelConfig's field order: what a known shape, a benchmark's
// synthetic model or a test picks (all required by model.json, none has a usable default).
struct ModelSizes {
  int vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int expert_width = 0, experts = 0, top_k = 0, max_positions = 0;
};

// A ModelConfig of `arch` with these sizes, QK-norm kind and expert quantisation; every other
// field keeps ModelConfig's default. The one place that maps ModelSizes onto ModelConfig.
// `model_dir / rel`, checked before anything opens it: after resolving symlinks it must lie inside
// model_dir (a link in a model may not lead a reader to /etc, another model or /dev/zero) and,
// when it exists, be a regular file (a directory when `directory`): a FIFO would block the reader
// and a device would never end. A path that does not exist passes (its open reports it).
// FormatError "<what>: ..." naming where it leads otherwise. Returns model_dir / rel.
std::filesystem::path check_model_file(const std::filesystem::path& model_dir, const std::filesystem::path& rel,
                                       const std::string& what, bool directory = false);

ModelConfig make_model_config(Arch arch, const ModelSizes& sizes, QkNorm qk_norm, QuantType expert_quant);

}  // namespace moestream
