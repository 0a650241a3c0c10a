// GGUF input for the architectures llama.cpp names "qwen2moe" (Qwen2MoeForCausalLM: Qwen1.5-MoE,
// Qwen2-57B-A14B) and "glm4moe" (Glm4MoeForCausalLM: GLM-4.5, 4.5-Air, 4.6): what they state
// beyond the fields every MoE GGUF shares (read in gguf_model.cpp), and their tensor names.
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
//             {arch}.rope.dimension_count (partial rotary);
//             the post-attention norm is blk.N.post_attention_norm.weight; attention biases and
//             per-head QK-norm when present.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "loader/format/gguf_file.h"
#include "loader/format/model_config.h"

namespace moestream {

// The GGUF name of a dense tensor named as in dense.safetensors, for a model of `arch`: the
// architecture's own names first (glm4moe's post-attention norm and correction bias), then the
// names every llama.cpp MoE GGUF shares (gguf_dense_name, plus attention biases, shared-expert and
// dense-MLP tensors). ConfigError for a name with no GGUF counterpart.
std::string gguf_dense_name(Arch arch, const std::string& our_name);

// Adds to `j` (model.json fields, before ModelConfig::from_json validates them) what a qwen2moe or
// glm4moe GGUF states beyond the shared fields, from its metadata (`a` is "<architecture>.") and
// tensors; FormatError naming the key for a value this build does not compute. Nothing for other
// architectures.
void gguf_arch_config(Arch arch, const GgufModelFiles& files, const std::string& where, const std::string& a,
                      nlohmann::json& j);

// Checks that every dense tensor cfg's extra fields call for (attention biases, shared experts and
// their gate, the correction bias, the dense MLP of the leading layers) exists with its shape;
// FormatError naming the file and tensor otherwise.
void gguf_check_extra_tensors(const GgufModelFiles& files, const std::string& where, const ModelConfig& cfg);

}  // namespace moestream
