// DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM, GGUF deepseek2) and DeepSeek-V2
// (DeepseekV2ForCausalLM): multi-head latent attention in every layer; the first
// first_k_dense_replace layers have a dense SwiGLU MLP, the rest routed experts beside an
// ungated shared expert. V3's router is the grouped sigmoid one with its correction bias; V2's a
// softmax, group-limited when n_group > 1. Both scale the routed weights.
#include "runtime/model/families/families.h"

namespace moestream::families {

namespace {
LayerSpec deepseek_layer(const ModelConfig& cfg, int l) {
  return LayerSpec{mla_block(cfg), cfg.is_moe_layer(l) ? routed_experts_block(cfg, l) : dense_mlp_block()};
}
}  // namespace

const FamilyDescription kDeepseekV3{Arch::kDeepseekV3, "deepseek_v3", deepseek_layer};
const FamilyDescription kDeepseekV2{Arch::kDeepseekV2, "deepseek_v2", deepseek_layer};

}  // namespace moestream::families
