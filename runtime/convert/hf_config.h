// Maps a Hugging Face `config.json` (Qwen3MoeForCausalLM, OlmoeForCausalLM, MixtralForCausalLM,
// Qwen2MoeForCausalLM) to a ModelConfig, rejecting every setting that would change the maths and
// that the runtime does not implement (dense MLP layers, sliding window in use, biases other than
// Qwen2-MoE's QKV ones, shared experts other than Qwen2-MoE's gated one, clip_qkv, ...).
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
