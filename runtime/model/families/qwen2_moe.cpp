// Qwen2-MoE (Qwen2MoeForCausalLM, GGUF qwen2moe): grouped-query attention whose q, k and v
// projections add a bias (sliding-window layers where use_sliding_window says), then routed
// experts (softmax top-k) beside a shared expert scaled by sigmoid(shared_expert_gate . x); the
// layers mlp_only_layers / decoder_sparse_step make dense (only leading ones:
// first_k_dense_replace) have a dense SwiGLU MLP instead.
#include "runtime/model/families/families.h"

namespace moestream::families {

const FamilyDescription kQwen2Moe{Arch::kQwen2Moe, "qwen2_moe", [](const ModelConfig& cfg, int l) {
                                    return LayerSpec{gqa_block(cfg, l), cfg.is_moe_layer(l)
                                                                            ? routed_experts_block(cfg, l)
                                                                            : dense_mlp_block()};
                                  }};

}  // namespace moestream::families
