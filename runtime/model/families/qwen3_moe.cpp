// Qwen3-MoE (transformers' Qwen3MoeForCausalLM, GGUF qwen3moe): every layer is grouped-query
// attention with an RMSNorm per head on q and k (qk_norm "per_head"), then routed experts under
// a softmax top-k router (renormalised when norm_topk_prob). No shared expert.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kQwen3Moe{Arch::kQwen3Moe, "qwen3_moe", [](const ModelConfig& cfg, int l) {
                                    return LayerSpec{gqa_block(cfg, l), routed_experts_block(cfg, l)};
                                  }};

}  // namespace moestream::families
