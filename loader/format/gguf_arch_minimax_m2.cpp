// GGUF input for the architecture llama.cpp names "minimax-m2" (MiniMaxM2ForCausalLM): what it
// states beyond the fields every MoE GGUF shares (read in gguf_model.cpp); its tensor names are
// gguf_dense_name's (gguf_arch.cpp).
//
// Facts of llama.cpp's converter and loader this relies on (docs/format.md, GGUF input): the
// llama-like tensors with no Q/K row permutation (rotate-half RoPE already);
// blk.N.attn_{q,k}_norm.weight over all heads ([H*hd] and [KV*hd]: qk_norm "full", read from
// their shapes); {arch}.rope.dimension_count = rotary_dim (partial rotary, the table's
// partial_rotary); {arch}.expert_feed_forward_length = the expert width (feed_forward_length too);
// the router's correction bias blk.N.exp_probs_b.bias. The converter writes no gating function,
// group counts, weight norm or scale: llama.cpp's graph routes by sigmoid with the bias for
// selection, renormalises the k weights and scales nothing, which is what transformers computes.
// A file that states otherwise is refused naming the key.
#include "loader/format/gguf_arch.h"

#include <nlohmann/json.hpp>

namespace moestream {

void extend_gguf_minimax_m2(const GgufModelFiles& files, const std::string& where, const std::string& a,
                            nlohmann::json& j) {
  const GgufMetadata& m = files.metadata();
  constexpr uint64_t kGatingSigmoid = 2;  // llama.cpp's expert_gating_func (llama-hparams.h); 0: its own
  if (const auto g = m.find_u64(a + "expert_gating_func"); g && *g != 0 && *g != kGatingSigmoid)
    gguf_arch_error(where, a + "expert_gating_func = " + std::to_string(*g) + ": minimax-m2 routes by sigmoid (2)");
  if (const auto n = m.find_u64(a + "expert_group_count"); n && *n > 1)
    gguf_arch_error(where, a + "expert_group_count = " + std::to_string(*n) + ": minimax-m2 has no expert groups");
  if (m.find_bool(a + "expert_weights_norm") == false)
    gguf_arch_error(where, a + "expert_weights_norm = false: minimax-m2 renormalises the top-k weights");
  if (const auto s = m.find_f64(a + "expert_weights_scale"); s && *s != 0 && *s != 1)
    gguf_arch_error(where, a + "expert_weights_scale = " + std::to_string(*s) + ": minimax-m2 scales nothing");
  if (const auto n = m.find_u64(a + "expert_shared_count"); n && *n > 0)
    gguf_arch_error(where, a + "expert_shared_count = " + std::to_string(*n) + ": minimax-m2 has no shared expert");
  if (files.find_tensor("blk.0.attn_q.bias") != nullptr)
    gguf_arch_error(where, "tensor 'blk.0.attn_q.bias': minimax-m2 has no attention biases");
  j["router_scoring"] = "sigmoid";
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["norm_topk_prob"] = true;
}

}  // namespace moestream
