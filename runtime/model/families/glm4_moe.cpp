// GLM-4.5 (Glm4MoeForCausalLM, GGUF glm4moe): grouped-query attention with biased q/k/v, partial
// rotary and optional QK-norm; the first first_k_dense_replace layers have a dense SwiGLU MLP,
// the rest routed experts under the grouped sigmoid router (correction bias for selection,
// routed_scaling_factor) beside an ungated shared expert.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kGlm4Moe{Arch::kGlm4Moe, "glm4_moe", [](const ModelConfig& cfg, int l) {
                                   return LayerSpec{gqa_block(cfg, l), cfg.is_moe_layer(l)
                                                                           ? routed_experts_block(cfg, l)
                                                                           : dense_mlp_block()};
                                 }};

}  // namespace moestream::families
