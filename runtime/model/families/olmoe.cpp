// OLMoE (OlmoeForCausalLM, GGUF olmoe): grouped-query attention with one RMSNorm over all heads
// of q and of k (qk_norm "full"), then routed experts under a softmax top-k router.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kOlmoe{Arch::kOlmoe, "olmoe", [](const ModelConfig& cfg, int l) {
                                 return LayerSpec{gqa_block(cfg, l), routed_experts_block(cfg, l)};
                               }};

}  // namespace moestream::families
