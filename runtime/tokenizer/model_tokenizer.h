// The tokenizer a model ships, for every front end (infer, the server, Python): a pack's
// tokenizer.json (model.json's tokenizer.file), or a GGUF's tokenizer.ggml.* metadata.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "loader/format/model_config.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

// nullopt when the model ships no tokenizer (a pack whose tokenizer.file is null). The
// tokenizer's end token, used when the model names none, must be a row of the model's output,
// or generation would never stop on it: ConfigError naming the file otherwise.
std::optional<Tokenizer> load_model_tokenizer(const std::filesystem::path& model, const ModelConfig& cfg);

// Ids whose sampling ends a reply: the model's EOS (`model_eos`, model.json's or the GGUF's), the
// tokenizer's, and the end-of-turn tokens of the chat formats we know (ChatML, Llama-2, Llama-3;
// harmony's <|return|> and <|call|>, after which a tool runs; GLM-4.5's <|user|> and
// <|observation|>) when the vocabulary has them as special tokens. `tok` may be null.
std::vector<int> end_of_turn_ids(std::optional<int> model_eos, const Tokenizer* tok);

}  // namespace moestream
