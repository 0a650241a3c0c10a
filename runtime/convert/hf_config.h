// Maps a Hugging Face `config.json` (Qwen3MoeForCausalLM, OlmoeForCausalLM, MixtralForCausalLM,
// Qwen2MoeForCausalLM, Glm4MoeForCausalLM, DeepSeek-V2/V3, gpt-oss, MiniMaxM2ForCausalLM) to a
// ModelConfig, rejecting every setting that would change the maths and that the runtime does not
// implement (dense MLP layers but GLM-4.5's first ones, sliding window in use, biases other than
// Qwen2-MoE's and GLM-4.5's QKV ones, shared experts other than Qwen2-MoE's gated and GLM-4.5's
// ungated ones, clip_qkv, ...).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "loader/format/model_config.h"

namespace moestream {

// `where` names the file in errors. Throws ConfigError (unsupported architecture or setting) or
// FormatError (missing or mistyped field). Fills every ModelConfig field that comes from the
// source model; the packed-format fields (dense dtype, expert quant, tokenizer) keep defaults.
ModelConfig model_config_from_hf(const nlohmann::json& hf, const std::string& where);

}  // namespace moestream
