// Expert selection replayed from a routing log (loader/format/routing_log.h) onto a model of any layer,
// expert and top-k counts: real routing traffic over synthetic weights (infer --replay-routing).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/format/routing_log.h"
#include "loader/format/model_config.h"

namespace moestream {

// The mapping rule, from a log of L_log layers, E_log experts, top-k k_log onto a model of L, E, K:
//   steps:   the log's tokens, one step per (request, position) in file order (prefill and decode
//            alike); model token n (counted since load) replays step n mod n_steps. A step that
//            lacks a record for some log layer (a truncated tail) is dropped.
//   layers:  model layer l replays log layer l mod L_log.
//   experts: log id e becomes e mod E; an id already taken by a better-ranked slot of the same
//            token moves to the next free id (+1, wrapping). With K < k_log the K best log slots
//            are kept; with K > k_log the missing slots take the next free ids after the last
//            mapped one, each with the weight of the log's weakest slot.
//   weights: the log's weights of the kept slots; when K != k_log they are rescaled to sum to
//            the log token's total top-k weight (1 for models that renormalise top-k).
// With the log's own model (same counts) ids and weights are replayed exactly.
class RoutingReplay {
 public:
  // Throws ConfigError when the log holds no complete step.
  RoutingReplay(const RoutingLog& log, const ModelConfig& cfg, std::string source);
  // Reads the log (IoError/FormatError name the file), then as above.
  static RoutingReplay load(const std::filesystem::path& path, const ModelConfig& cfg);

  // Writes n_tokens * top_k ids and weights for layer `layer`, tokens ordinal.. (a RoutingOverrideFn).
  void route(int layer, uint64_t ordinal, int n_tokens, int* ids, float* weights) const;

  size_t n_steps() const { return n_steps_; }
  size_t dropped_steps() const { return dropped_steps_; }
  // One line for outputs: "replay of FILE: N steps, log L x E top-k -> model L x E top-K (rule)".
  const std::string& describe() const { return describe_; }

 private:
  int L_ = 0, K_ = 0;
  size_t n_steps_ = 0, dropped_steps_ = 0;
  std::vector<int> ids_;        // [step][layer][K]
  std::vector<float> weights_;  // same shape
  std::string describe_;
};

}  // namespace moestream
