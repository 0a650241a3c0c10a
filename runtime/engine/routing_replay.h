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
//
// Per request (concurrent sequences, each replaying its own traffic: Model::set_sequence_routing):
// the log's request ids in order of first appearance are requests 0..n_requests()-1; request r's
// complete steps sorted by position are its steps s_0..s_{n-1}, and a token at position p of a
// sequence replaying request r takes s_{p mod n} (with a log of infer's, whose positions run from
// 0, exactly the token the log recorded at p). Several logs (a directory) concatenate their steps
// and requests in file-name order; they must share their layer, expert and top-k counts.
class RoutingReplay {
 public:
  // Throws ConfigError when the log holds no complete step.
  RoutingReplay(const RoutingLog& log, const ModelConfig& cfg, std::string source);
  // Reads the log, or every regular file of a directory in name order (IoError/FormatError name
  // the file; ConfigError for an empty directory or logs of different counts), then as above.
  static RoutingReplay load(const std::filesystem::path& path, const ModelConfig& cfg);

  // Writes n_tokens * top_k ids and weights for layer `layer`, tokens ordinal.. (a RoutingOverrideFn).
  void route(int layer, uint64_t ordinal, int n_tokens, int* ids, float* weights) const;
  // The same for request `request` (< n_requests()), tokens at positions position.. of a sequence.
  void route_request(size_t request, int layer, uint64_t position, int n_tokens, int* ids,
                     float* weights) const;

  size_t n_steps() const { return n_steps_; }
  size_t dropped_steps() const { return dropped_steps_; }
  size_t n_requests() const { return request_steps_.size(); }
  size_t request_steps(size_t request) const { return request_steps_.at(request).size(); }
  // One line for outputs: "replay of FILE: N steps, log L x E top-k -> model L x E top-K (rule)".
  const std::string& describe() const { return describe_; }

 private:
  explicit RoutingReplay(const ModelConfig& cfg) : L_(cfg.n_moe_layers()), K_(cfg.n_experts_per_tok) {}
  // Maps the log's complete steps onto the model and appends them (steps and requests).
  void add(const RoutingLog& log, int n_experts, const std::string& source);
  void set_describe(const RoutingLogHeader& h, int n_experts, const std::string& source, size_t n_logs);
  void copy_step(size_t step, int layer, int* ids, float* weights) const;

  int L_ = 0, K_ = 0;
  size_t n_steps_ = 0, dropped_steps_ = 0;
  std::vector<int> ids_;        // [step][layer][K]
  std::vector<float> weights_;  // same shape
  std::vector<std::vector<uint32_t>> request_steps_;  // [request]: its steps by position
  std::string describe_;
};

}  // namespace moestream
