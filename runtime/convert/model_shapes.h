// The architectures of released Mixture-of-Experts models, by name, as ModelConfigs: what
// synth_model writes at true size when the real weights are not at hand.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "loader/format/model_config.h"

namespace moestream {

// Names accepted by known_shape(): "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b",
// "olmoe-1b-7b", "qwen2-57b-a14b", "glm-4.5-air", "deepseek-v3", "kimi-k2", "gpt-oss-120b",
// "gpt-oss-20b".
std::vector<std::string> known_shape_names();

// The shape's ModelConfig, values from the model's Hugging Face config.json (vocab, hidden,
// layers, heads, kv heads, head_dim, moe_intermediate_size, experts, top-k, norm_topk_prob,
// rms_norm_eps, rope_theta, max_position_embeddings, QK-norm kind, Qwen2-MoE's shared expert
// width and QKV biases; GLM-4.5-Air's routing, shared expert, dense first layer and partial
// rotary; gpt-oss's sinks, windows, biases, YaRN and clamped SwiGLU), dense weights bf16, experts
// q4 (gpt-oss: MXFP4, as released), no tokenizer and no bos/eos id (random weights: an eos would
// end a benchmark early).
// Throws ConfigError listing the known names for any other name.
ModelConfig known_shape(std::string_view name);

// Divides the widths (hidden, expert widths, vocab) by `factor`, keeping layer, head, expert and
// top-k counts: a small stand-in of the same structure for tests. factor >= 1; a width never
// drops below 32 (one quant block), and with ggml-typed experts (MXFP4) is a multiple of 32.
ModelConfig scaled_down(ModelConfig cfg, int factor);

// Sets n_layers; a model with sliding-window layers gets gpt-oss's alternating pattern (even
// layers slide) for the new count, so model.json's layer_types stays one per layer.
void set_layer_count(ModelConfig& cfg, int layers);

}  // namespace moestream
