// Tests of cluster/cache_sim.h: Belady's MIN against known optima (a textbook sequence and an
// exhaustive search), the one-layer-at-once rule, and how a routing log becomes decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "cluster/cache_sim.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/routing_log.h"

namespace moestream {
namespace {

// One expert per group, each group its own step: a plain reference string.
CacheTrace single_accesses(int n_experts, const std::vector<int>& refs) {
  CacheTrace t;
  t.n_layers = 1;
  t.n_experts = n_experts;
  for (int r : refs) {
    t.group_begin.push_back(uint32_t(t.keys.size()));
    t.step_begins.push_back(1);
    t.keys.push_back(r);
  }
  t.group_begin.push_back(uint32_t(t.keys.size()));
  return t;
}

// Most hits any eviction sequence achieves, by trying every victim (and, with `bypass`, not
// inserting the miss at all).
uint64_t exhaustive_best(const std::vector<int>& refs, int capacity, bool bypass = false) {
  std::function<uint64_t(size_t, std::set<int>)> go = [&](size_t i, std::set<int> cache) -> uint64_t {
    if (i == refs.size()) return 0;
    if (cache.count(refs[i])) return 1 + go(i + 1, cache);
    if (int(cache.size()) < capacity) {
      cache.insert(refs[i]);
      return go(i + 1, cache);
    }
    uint64_t best = bypass ? go(i + 1, cache) : 0;
    for (int v : std::set<int>(cache)) {
      std::set<int> next = cache;
      next.erase(v);
      next.insert(refs[i]);
      best = std::max(best, go(i + 1, next));
    }
    return best;
  };
  return go(0, {});
}

TEST(CacheSim, BeladyAndLruMatchTheTextbookReferenceString) {
  // 1,2,3,4,1,2,5,1,2,3,4,5 with 3 frames: OPT 7 faults, LRU 10 faults (12 references).
  const CacheTrace t = single_accesses(6, {1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5});
  EXPECT_EQ(simulate_belady(t, 3).hits, 5u);
  EXPECT_EQ(simulate_lru(t, 3).hits, 2u);
  EXPECT_EQ(simulate_belady(t, 3).accesses, 12u);
}

TEST(CacheSim, BeladyEqualsExhaustiveSearchAndBoundsOnlinePolicies) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int n_experts = 3 + int(rng() % 3);
    const int capacity = 1 + int(rng() % 3);
    std::vector<int> refs(12);
    for (int& r : refs) r = int(rng() % uint32_t(n_experts));
    const CacheTrace t = single_accesses(n_experts, refs);
    const uint64_t opt = simulate_belady(t, capacity).hits;
    EXPECT_EQ(opt, exhaustive_best(refs, capacity)) << "trial " << trial;
    EXPECT_EQ(simulate_belady(t, capacity, true).hits, exhaustive_best(refs, capacity, true))
        << "trial " << trial;
    EXPECT_LE(simulate_lru(t, capacity).hits, opt);
    EXPECT_LE(simulate_lfru(t, capacity).hits, opt);
    EXPECT_LE(simulate_lrfu(t, capacity, 4).hits, opt);
    EXPECT_LE(simulate_lrfu(t, capacity, 0, true).hits, simulate_belady(t, capacity, true).hits);
  }
}

TEST(CacheSim, ALayerKeepsAllItsExpertsWhileItRuns) {
  // Groups {0,1} {2,3} {0,1} of one layer. With room for 2 the middle group must evict both;
  // with room for 3 Belady keeps 0 (used sooner than 1): one hit.
  CacheTrace t;
  t.n_layers = 1;
  t.n_experts = 4;
  t.keys = {0, 1, 2, 3, 0, 1};
  t.group_begin = {0, 2, 4, 6};
  t.step_begins = {1, 1, 1};
  EXPECT_EQ(simulate_belady(t, 2).hits, 0u);
  EXPECT_EQ(simulate_belady(t, 3).hits, 1u);
  EXPECT_THROW(simulate_belady(t, 1), ConfigError);
  EXPECT_THROW(simulate_lfru(t, 1), ConfigError);
}

TEST(CacheSim, FrequencyPoliciesKeepTheHotExpertOfAStationaryTrace) {
  // Expert 0 in half the accesses, the other 7 uniformly, room for 2: LFU-like policies keep 0
  // (hit rate >= its share, 0.5) and use the other slot for the forced insertion of each miss;
  // LRU loses 0 whenever two other experts come in a row.
  std::mt19937 rng(5);
  std::vector<int> refs;
  for (int i = 0; i < 4000; ++i) refs.push_back(rng() % 2 ? 0 : 1 + int(rng() % 7));
  const CacheTrace t = single_accesses(8, refs);
  const double share = double(std::count(refs.begin(), refs.end(), 0)) / double(refs.size());
  const double lfru = simulate_lfru(t, 2).hit_rate();
  EXPECT_GE(lfru, share);
  EXPECT_GE(simulate_lrfu(t, 2, 0).hit_rate(), share);
  EXPECT_LE(lfru, simulate_static_top(t, 2).hit_rate() + 0.02);
  EXPECT_LT(simulate_lru(t, 2).hit_rate(), lfru);
}

TEST(CacheSim, RoutingLogDecodeRecordsBecomeSteps) {
  TempDir d;
  const auto path = d.path() / "r.bin";
  RoutingLogHeader h;
  h.n_layers = 2;
  h.n_experts = 8;
  h.top_k = 2;
  h.hidden = 4;
  {
    RoutingLogWriter w(path, h);
    auto rec = [&](uint64_t req, uint32_t pos, RoutingPhase ph, uint16_t layer,
                   std::vector<uint16_t> ids) {
      RoutingRecord r;
      r.request_id = req, r.position = pos, r.phase = ph, r.layer = layer;
      r.ids = std::move(ids);
      r.weights = {0.6f, 0.4f};
      w.append(r);
    };
    rec(0, 0, RoutingPhase::kPrefill, 0, {7, 6});
    rec(0, 0, RoutingPhase::kPrefill, 1, {5, 4});
    rec(0, 1, RoutingPhase::kDecode, 0, {1, 2});
    rec(0, 1, RoutingPhase::kDecode, 1, {3, 0});
    rec(0, 2, RoutingPhase::kDecode, 0, {1, 5});
    rec(0, 2, RoutingPhase::kDecode, 1, {2, 0});
    rec(1, 1, RoutingPhase::kDecode, 0, {4, 1});
    w.close();
  }
  const RoutingLog log = read_routing_log(path);
  const CacheTrace t = make_cache_trace(log, true);
  EXPECT_EQ(t.keys, (std::vector<int>{1, 2, 8 + 3, 8 + 0, 1, 5, 8 + 2, 8 + 0, 4, 1}));
  EXPECT_EQ(t.n_groups(), 5u);
  EXPECT_EQ(t.n_steps(), 3u);  // (0,1), (0,2), (1,1): same position, another request
  const CacheTrace all = make_cache_trace(log, false);
  EXPECT_EQ(all.keys.size(), 14u);
  EXPECT_EQ(all.n_steps(), 4u);
}

}  // namespace
}  // namespace moestream
