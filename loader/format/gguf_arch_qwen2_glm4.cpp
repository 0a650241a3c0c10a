// GGUF input for the architectures llama.cpp names "qwen2moe" (Qwen2MoeForCausalLM: Qwen1.5-MoE,
// Qwen2-57B-A14B) and "glm4moe" (Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6): what they state
// beyond the fields every MoE GGUF shares (read in gguf_model.cpp); their tensor names are
// gguf_dense_name's (gguf_arch.cpp).
//
// Facts of llama.cpp's converter these rely on (no Q/K row permutation for either: both use
// rotate-half RoPE already). Both: blk.N.attn_{q,k,v}.bias when the model has biases;
// {arch}.expert_weights_scale (0 or absent: none) scales the routed experts.
//   qwen2moe  {arch}.expert_shared_feed_forward_length = the shared expert's width;
//             blk.N.attn_{q,k,v}.bias; blk.N.ffn_{gate,up,down}_shexp.weight and the shared
//             expert's sigmoid gate blk.N.ffn_gate_inp_shexp.weight ([D] or [D, 1], ne0 first);
//             routing softmax over all experts, top-k weights not renormalised.
//   glm4moe   {arch}.block_count counts the MTP blocks ({arch}.nextn_predict_layers) after the
//             decoder layers (ignored here); {arch}.leading_dense_block_count dense-MLP layers
//             first (blk.N.ffn_{gate,up,down}.weight of width {arch}.feed_forward_length);
//             {arch}.expert_shared_count ungated shared experts of the routed width;
//             {arch}.expert_gating_func 2 (sigmoid; absent means sigmoid) with the selection-only
//             correction bias blk.N.exp_probs_b.bias; {arch}.expert_group_count /
//             expert_group_used_count (n_group, topk_group); {arch}.expert_weights_norm;
//             {arch}.rope.dimension_count (partial rotary: the table's partial_rotary, read
//             with the shared fields);
//             the post-attention norm is blk.N.post_attention_norm.weight; attention biases and
//             per-head QK-norm when present.
//
// The llama-like reader (gguf_model.cpp) reads what they share with qwen3moe; these add the rest
// (their entries in gguf_arch.cpp's table).
#include "loader/format/gguf_arch.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moestream {
namespace {

using json = nlohmann::json;

// A metadata count that must fit model.json's int fields.
int count_of(const std::string& where, const std::string& key, uint64_t v) {
  if (v > (uint64_t(1) << 30))
    gguf_arch_error(where, "metadata " + key + " = " + std::to_string(v) + " is out of range");
  return int(v);
}

// llama.cpp's expert_gating_func values (llama-hparams.h): 1 softmax, 2 sigmoid; 0 or absent: the
// architecture's own.
constexpr uint64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

void qwen2moe_fields(const GgufModelFiles& f, const std::string& where, const std::string& a, json& j) {
  const GgufMetadata& m = f.metadata();
  const uint64_t D = j["hidden_size"].get<uint64_t>();
  if (const auto g = m.find_u64(a + "expert_gating_func"); g && *g != 0 && *g != kGatingSoftmax)
    gguf_arch_error(where, a + "expert_gating_func = " + std::to_string(*g) + ": qwen2moe routes by softmax (1)");
  // The shared expert every Qwen2-MoE has (llama.cpp requires it): its width from the tensor, which
  // the metadata, when it states one, must agree with.
  const GgufTensor* sg = f.find_tensor("blk.0.ffn_gate_shexp.weight");
  if (sg == nullptr)
    gguf_arch_error(where, "tensor 'blk.0.ffn_gate_shexp.weight' is missing: qwen2moe has a shared expert");
  if (sg->dims.size() != 2 || sg->dims[0] != D)
    gguf_arch_error(where,
                    "tensor 'blk.0.ffn_gate_shexp.weight' is not [" + std::to_string(D) + ", width] (ne0 first)");
  const uint64_t width = sg->dims[1];
  gguf_arch_agree(m, where, a + "expert_shared_feed_forward_length", width);
  j["shared_expert_intermediate_size"] = count_of(where, "shared expert width", width);
  j["shared_expert_gated"] = true;
}

void glm4moe_fields(const GgufModelFiles& f, const std::string& where, const std::string& a, json& j) {
  const GgufMetadata& m = f.metadata();
  const uint64_t F = j["moe_intermediate_size"].get<uint64_t>();
  if (const auto g = m.find_u64(a + "expert_gating_func"); g && *g != 0 && *g != kGatingSigmoid)
    gguf_arch_error(where, a + "expert_gating_func = " + std::to_string(*g) +
                    ": glm4moe is computed with sigmoid routing (2) only");
  j["router_scoring"] = "sigmoid";
  j["n_group"] = count_of(where, a + "expert_group_count", m.find_u64(a + "expert_group_count").value_or(1));
  j["topk_group"] =
      count_of(where, a + "expert_group_used_count", m.find_u64(a + "expert_group_used_count").value_or(1));
  // Absent: llama.cpp's default, no renormalisation (its converter always writes the key).
  j["norm_topk_prob"] = m.find_bool(a + "expert_weights_norm").value_or(false);
  const uint64_t n_shared = m.find_u64(a + "expert_shared_count").value_or(0);
  if (n_shared > 0) {
    if (n_shared > (uint64_t(1) << 20) || n_shared * F > (uint64_t(1) << 30))
      gguf_arch_error(where,
                      "metadata " + a + "expert_shared_count = " + std::to_string(n_shared) + " is out of range");
    j["shared_expert_intermediate_size"] = n_shared * F;
    j["shared_expert_gated"] = false;
  }
  if (m.find(a + "rope.dimension_sections") != nullptr)
    gguf_arch_error(where, a + "rope.dimension_sections: multimodal RoPE sections (GLM-4.5V) are not supported");
}

// Both: attention biases, present on every layer or on none (checked per layer afterwards), and the
// routed experts' weight scale, which llama.cpp reads as "no scaling" when 0 or absent.
void common_fields(const GgufModelFiles& files, const std::string& a, json& j) {
  if (files.find_tensor("blk.0.attn_q.bias") != nullptr) j["qkv_bias"] = true;
  if (const auto s = files.metadata().find_f64(a + "expert_weights_scale"); s && *s != 0)
    j["routed_scaling_factor"] = *s;
}

}  // namespace

void extend_gguf_qwen2moe(const GgufModelFiles& files, const std::string& where, const std::string& a, json& j) {
  common_fields(files, a, j);
  qwen2moe_fields(files, where, a, j);
}

void extend_gguf_glm4moe(const GgufModelFiles& files, const std::string& where, const std::string& a, json& j) {
  common_fields(files, a, j);
  glm4moe_fields(files, where, a, j);
}

void gguf_arch_check_extra_tensors(const GgufModelFiles& files, const std::string& where, const ModelConfig& c) {
  const uint64_t D = uint64_t(c.hidden_size), E = uint64_t(c.n_experts);
  const uint64_t qd = uint64_t(c.n_heads) * uint64_t(c.head_dim), kvd = uint64_t(c.n_kv_heads) * uint64_t(c.head_dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto name = [&](const char* field) { return gguf_dense_name(c.arch, p + field); };
    if (c.qkv_bias) {
      gguf_arch_shaped(files, where, name("bq"), {qd});
      gguf_arch_shaped(files, where, name("bk"), {kvd});
      gguf_arch_shaped(files, where, name("bv"), {kvd});
    }
    if (!c.is_moe_layer(l)) {
      const uint64_t I = uint64_t(c.intermediate_size);
      gguf_arch_shaped(files, where, name("mlp_gate"), {D, I});
      gguf_arch_shaped(files, where, name("mlp_up"), {D, I});
      gguf_arch_shaped(files, where, name("mlp_down"), {I, D});
      continue;
    }
    if (c.router_scoring == RouterScoring::kSigmoid) gguf_arch_shaped(files, where, name("router_bias"), {E});
    if (c.has_shared_expert()) {
      const uint64_t S = uint64_t(c.shared_expert_intermediate_size);
      gguf_arch_shaped(files, where, name("shared_gate"), {D, S});
      gguf_arch_shaped(files, where, name("shared_up"), {D, S});
      gguf_arch_shaped(files, where, name("shared_down"), {S, D});
      // llama.cpp's converter keeps transformers' [1, D] (ne [D, 1]); llama.cpp itself asks for [D].
      if (c.shared_expert_gated) gguf_arch_shaped_any(files, where, name("shared_expert_gate"), {{D, 1}, {D}});
    }
  }
}

}  // namespace moestream
