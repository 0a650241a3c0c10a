// Replays the demand accesses of a routing log through expert-cache policies at one capacity in
// experts: both tiers' policies through their common interface (loader/store/cache_policy.h: the
// host cache's LFU with aging, the GPU cache's LFRU), LRU, LRFU and Belady's optimal. Hit rates
// for bench/cache_sim.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loader/format/routing_log.h"
#include "loader/store/cache_policy.h"
#include "loader/store/lfru_policy.h"

namespace moestream {

// The accesses in order: one group per (token, layer), whose experts are needed together (the
// kernels of one layer read all of them), groups of one token form a decode step.
struct CacheTrace {
  int n_layers = 0, n_experts = 0;
  std::vector<int> keys;              // layer * n_experts + expert, one per access
  std::vector<uint32_t> group_begin;  // index into keys of each group, plus keys.size() at the end
  std::vector<uint8_t> step_begins;   // by group: 1 when the group starts a new decode step
  size_t n_groups() const { return group_begin.empty() ? 0 : group_begin.size() - 1; }
  size_t n_steps() const;
};

// Decode records only (decode_only) or every record, each (request, position) one step, in file
// order. Throws ConfigError when no record qualifies.
CacheTrace make_cache_trace(const RoutingLog& log, bool decode_only);

struct CacheSimResult {
  uint64_t accesses = 0, hits = 0;
  double hit_rate() const { return accesses ? double(hits) / double(accesses) : 0.0; }
};

// capacity in experts (all experts one size); each must be >= the largest group (else a layer
// could not hold its own experts): ConfigError otherwise.
CacheSimResult simulate_lru(const CacheTrace& t, int capacity);
// Belady's MIN: on a miss with the cache full, evict the resident whose next use is farthest
// (never one of the current group's experts). Every miss is inserted, as a demand fill must be.
// With `bypass`, a miss used later than every evictable resident is served without being cached
// (the GPU cache's scratch area): the optimum when demand may skip the cache.
CacheSimResult simulate_belady(const CacheTrace& t, int capacity, bool bypass = false);
// Any CachePolicy as the caches drive it: each access a demand access() (lookup, insert on a
// miss), the current group's slots pinned until the group is done, one advance_step() per decode
// step. A miss refused a slot (admission) is served uncached: a miss, the residents stay. The
// policy's capacity must hold the widest group (the wrappers below check). before_group (optional)
// is called with each group's index after the step is advanced and before its accesses (what the
// engine tells the policy at that point: simulate_policy_with_hints).
CacheSimResult simulate_policy(const CacheTrace& t, CachePolicy& policy,
                               const std::function<void(size_t group)>& before_group = {});
// The GPU cache's policy (loader/store/lfru_policy.h: LFRU, decaying demand heat, optional demand
// admission) with room for `capacity` experts.
CacheSimResult simulate_lfru(const CacheTrace& t, int capacity, LfruPolicyOptions options = {});

// LRFU (Lee et al., 2001): score = sum over past demand accesses of 2^(-age / half_life), age in
// decode steps; the lowest-scoring resident outside the current group is evicted. A half-life of
// infinity (0 here) is LFU with history, as LFRU's high bits; a short one approaches LRU.
// With `admission`, a miss scoring below the would-be victim is served without being cached
// (TinyLFU-style admission, through scratch).
CacheSimResult simulate_lrfu(const CacheTrace& t, int capacity, double half_life_steps,
                             bool admission = false);
// The host cache's policy (loader/store/lfu_policy.h: LFU with aging every `aging_period` uses,
// 0 for its default) with `capacity` slots.
CacheSimResult simulate_lfu(const CacheTrace& t, int capacity, uint64_t aging_period = 0);
// The best fixed set: the `capacity` experts most used over the whole trace always resident, all
// others never (an oracle of frequencies, not of order).
CacheSimResult simulate_static_top(const CacheTrace& t, int capacity);

}  // namespace moestream
