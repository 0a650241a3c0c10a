// The tokenizer a model ships, for every front end (infer, the server, Python): a pack's
// tokenizer.json (model.json's tokenizer.file), or a GGUF's tokenizer.ggml.* metadata.
#pragma once

#include <filesystem>
#include <optional>

#include "loader/format/model_config.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

// nullopt when the model ships no tokenizer (a pack whose tokenizer.file is null). The
// tokenizer's end token, used when the model names none, must be a row of the model's output,
// or generation would never stop on it: ConfigError naming the file otherwise.
std::optional<Tokenizer> load_model_tokenizer(const std::filesystem::path& model, const ModelConfig& cfg);

}  // namespace moestream
