// Mixtral (MixtralForCausalLM, GGUF llama with experts): plain grouped-query attention, then
// routed experts; the router's softmax over the top-k logits is the renormalised softmax top-k.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kMixtral{Arch::kMixtral, "mixtral", [](const ModelConfig& cfg, int l) {
                                   return LayerSpec{gqa_block(cfg, l), routed_experts_block(cfg, l)};
                                 }};

}  // namespace moestream::families
