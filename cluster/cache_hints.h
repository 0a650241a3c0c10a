// What the engine knows of the future, for cache_sim to replay beside a trace: the look-ahead's
// guesses (later layers' routers applied to a layer's router input, as the GPU pass does for
// L+1), and, as a labelled upper bound, the true next layers' ids with noise.
#pragma once

#include <cstdint>
#include <vector>

#include "cluster/cache_sim.h"
#include "loader/format/routing_log.h"

namespace moestream {

// Guesses made at each group of a CacheTrace (after its experts are routed), each for a layer's
// next visit (later this step, or the next step's), up to `width` ids best first (-1 pads).
struct CacheHints {
  int width = 0;
  std::vector<uint32_t> group_begin;  // by group: index of its first guess; plus the end
  std::vector<int> layer;             // by guess: the layer guessed
  std::vector<int> experts;           // by guess: `width` expert ids
};

// Router l applied to the router input of every record (the records make_cache_trace keeps, in
// its order) for layers L+1..L+depth (`width` best), and with self_width > 0 the record's own
// router ranked (`self_width` best: the router's scores, a guess of the layer's next step):
// routers[l] holds n_experts x hidden floats, row-major.
// ConfigError when a record has no router input (infer --collect-router-inputs) or a router's
// size does not match the log's header.
CacheHints make_lookahead_hints(const RoutingLog& log, bool decode_only,
                                const std::vector<std::vector<float>>& routers, int depth, int width,
                                int self_width = 0);

// Upper bound, not an online policy's input: the ids the trace really uses at the same layer in
// the next step and at the next `depth` groups of this step, each replaced by a random other
// expert with probability `noise`.
CacheHints make_oracle_hints(const CacheTrace& t, int depth, double noise, uint64_t seed);

// Replays like simulate_policy, and hands the policy each group's guesses (CachePolicy::hint,
// from the group's layer) before the group's accesses, as the engine knows them then.
CacheSimResult simulate_policy_with_hints(const CacheTrace& t, CachePolicy& policy,
                                          const CacheHints& hints);

}  // namespace moestream
