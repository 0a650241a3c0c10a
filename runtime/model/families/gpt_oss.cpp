// gpt-oss (GptOssForCausalLM, GGUF gpt-oss): grouped-query attention with biased projections and
// a learned sink logit per head, alternating sliding-window and full layers (layer_types); then
// routed experts under a router whose logits add a bias and whose weights are a softmax over the
// k selected logits; the experts' SwiGLU is clamped and adds per-expert biases (expert layout).
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kGptOss{Arch::kGptOss, "gpt_oss", [](const ModelConfig& cfg, int l) {
                                  return LayerSpec{gqa_block(cfg, l), routed_experts_block(cfg, l)};
                                }};

}  // namespace moestream::families
