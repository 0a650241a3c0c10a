// What infer and moestream-server do alike with the engine options they parsed (option_cli.h):
// the model options, checked before any slow load, and the expert store they describe.
#pragma once

#include <filesystem>
#include <memory>

#include "loader/store/expert_store.h"
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"

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

}  // namespace moestream
