// Implementation of tools/engine_cli.h.
#include "tools/engine_cli.h"

#include <cstdio>
#include <memory>
#include <string>

#include "common/progress.h"
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

}  // namespace moestream
