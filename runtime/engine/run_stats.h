// The figures `infer --timing` prints and `--stats-json` writes: per-phase times, prefill and
// decode tokens/s, expert-store counters and perplexity, as text and as JSON.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine/generate.h"

namespace moestream {

struct RunInfo {
  std::string model_dir, arch, quant;
  int threads = 0;
  int context = 0;
  std::string expert_io;  // ExpertStore::describe(): how experts are read
  std::string gpu;        // GpuForwardInfo::describe() with --gpu; empty on the CPU path
  std::string routing;    // RoutingReplay::describe() when experts are replayed; empty = router
};

nlohmann::json run_stats_json(const RunInfo& info, const std::optional<GenerateStats>& gen,
                              const std::optional<PerplexityResult>& ppl);
std::string run_stats_text(const RunInfo& info, const std::optional<GenerateStats>& gen,
                           const std::optional<PerplexityResult>& ppl);

}  // namespace moestream
