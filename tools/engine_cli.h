// What infer and moestream-server do alike with the engine options they parsed (option_cli.h):
// the model options, checked before any slow load, and the expert store they describe.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "loader/store/expert_store.h"
#include "runtime/chat/chat_prompt.h"
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

// s.model_options() with a progress line for gpu_preload; throws ConfigError at once (before any
// slow load) for options that cannot work (check_model_options).
ModelOptions engine_model_options(const EngineSettings& s);

// Opens the expert store `s` describes (loader/store/store_options.h) for a model loaded with `mo`
// (store_config_for); `tool` prefixes its warnings and the read engine's notices on stderr, which
// name options as flags.
std::unique_ptr<ExpertStore> open_engine_store(const EngineSettings& s, const ModelOptions& mo,
                                               const std::filesystem::path& dir, const ModelConfig& cfg,
                                               const char* tool);

// The model's chat template: a GGUF's tokenizer.chat_template metadata (a pack's dense.gguf keeps
// a converted GGUF's) with its bos/eos tokens, as llama-server takes them, else the pack's
// tokenizer_config.json; nullopt when there is neither (ChatPrompt::load may give one without a
// template too: check has_template()).
std::optional<ChatPrompt> load_model_chat_prompt(const std::filesystem::path& dir, const ModelConfig& cfg,
                                                 const Tokenizer& tok);

}  // namespace moestream
