// MiniMax-M2 (MiniMaxM2ForCausalLM, GGUF minimax-m2): grouped-query attention with one RMSNorm over
// all heads of q and of k before the head split (qk_norm "full", as OLMoE) and partial rotary
// (rotary_dim of head_dim, as GLM-4.5); then routed experts under the sigmoid router with its
// correction bias (selection only) in one group, renormalised, unscaled. No shared expert, no
// dense layer: no new block kind, only a choice of existing ones.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kMinimaxM2{Arch::kMinimaxM2, "minimax_m2", [](const ModelConfig& cfg, int l) {
                                     return LayerSpec{gqa_block(cfg, l), routed_experts_block(cfg, l)};
                                   }};

}  // namespace moestream::families
