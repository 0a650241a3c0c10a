// Per-layer co-activation statistics from routing logs: how often each expert is chosen, how often
// two experts are chosen for the same token (and, optionally, for neighbouring tokens).
#pragma once

#include <cstdint>
#include <vector>

#include "loader/format/routing_log.h"

namespace moestream::cluster {

// One token's selected experts in one layer (logical ids), as the cost model consumes them.
using ExpertSet = std::vector<uint16_t>;

struct LayerStats {
  uint32_t n_experts = 0;
  std::vector<uint64_t> uses;          // [n]: tokens that chose expert e
  std::vector<double> coact;           // [n*n], symmetric: same-token pairs (+ neighbour weight)
  std::vector<ExpertSet> token_sets;   // every token's selection, in log order
  double at(uint32_t a, uint32_t b) const { return coact[size_t(a) * n_experts + b]; }
};

struct CoactivationOptions {
  // Weight of a pair chosen by consecutive tokens of the same request (0 = same token only):
  // the next token's misses are cheaper when they sit near the experts just read.
  double neighbour_weight = 0.0;
};

// Statistics for every layer of the logs (all must share one header; else ConfigError).
std::vector<LayerStats> coactivation(const std::vector<RoutingLog>& logs,
                                     const CoactivationOptions& opts = {});

}  // namespace moestream::cluster
