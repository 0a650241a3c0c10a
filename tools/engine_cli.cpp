// Implementation of tools/engine_cli.h.
#include "tools/engine_cli.h"

#include <cstdio>
#include <memory>
#include <string>

#include "common/progress.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"
#include "loader/store/store_options.h"

namespace moestream {

ModelOptions engine_model_options(const EngineSettings& s) {
  ModelOptions mo = s.model_options();
  if (mo.gpu_preload) {
    auto progress = std::make_shared<Progress>("gpu-preload", true);
    mo.on_gpu_preload = [progress](int done, int total) {
      progress->update(uint64_t(done), uint64_t(total), "MoE layers in the GPU cache");
    };
  }
  check_model_options(mo);  // before the store opens and the weights load
  return mo;
}

std::unique_ptr<ExpertStore> open_engine_store(const EngineSettings& s, const ModelOptions& mo,
                                               const std::filesystem::path& dir, const ModelConfig& cfg,
                                               const char* tool) {
  const std::string prefix = tool;
  return open_store_for(dir, cfg, store_config_for(mo, s.store), [prefix](const std::string& line) {
    std::fprintf(stderr, "%s: %s\n", prefix.c_str(), render_options(line, OptionCaller::kCli).c_str());
  });
}

std::optional<ChatPrompt> load_model_chat_prompt(const std::filesystem::path& dir, const ModelConfig& cfg,
                                                 const Tokenizer& tok) {
  if (cfg.format == ModelFormat::kGguf || is_gguf_file(dir / cfg.tokenizer_file)) {
    const GgufModelFiles files(cfg.format == ModelFormat::kGguf ? dir : dir / cfg.tokenizer_file);
    const std::string* t = files.metadata().find_string("tokenizer.chat_template");
    if (!t) return std::nullopt;
    nlohmann::ordered_json special = nlohmann::ordered_json::object();
    if (tok.bos_id()) special["bos_token"] = tok.token_text(*tok.bos_id());
    if (tok.eos_id()) special["eos_token"] = tok.token_text(*tok.eos_id());
    return ChatPrompt(*t, std::move(special));
  }
  if (cfg.tokenizer_config_file.empty()) return std::nullopt;
  return ChatPrompt::load(dir / cfg.tokenizer_config_file);
}

}  // namespace moestream
