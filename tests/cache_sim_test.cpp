// Tests of cluster/cache_sim.h: Belady's MIN against known optima (a textbook sequence and an
// exhaustive search), both tiers' policies replayed through the common CachePolicy interface,
// the one-layer-at-once rule, and how a routing log becomes decode steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "cluster/cache_sim.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/store/lfu_policy.h"
#include "loader/store/lfru_policy.h"
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
    EXPECT_LE(simulate_lfu(t, capacity).hits, simulate_belady(t, capacity, true).hits);
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
  EXPECT_THROW(simulate_lfu(t, 1), ConfigError);
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
  EXPECT_GE(simulate_lfu(t, 2).hit_rate(), share);
  EXPECT_GE(simulate_lrfu(t, 2, 0).hit_rate(), share);
  EXPECT_LE(lfru, simulate_static_top(t, 2).hit_rate() + 0.02);
  EXPECT_LT(simulate_lru(t, 2).hit_rate(), lfru);
}

// Two layers x 6 experts, `steps` decode steps of 2 groups of 2 experts, skewed popularity.
CacheTrace two_layer_trace(int steps, unsigned seed) {
  std::mt19937 rng(seed);
  CacheTrace t;
  t.n_layers = 2;
  t.n_experts = 6;
  for (int s = 0; s < steps; ++s)
    for (int layer = 0; layer < 2; ++layer) {
      t.group_begin.push_back(uint32_t(t.keys.size()));
      t.step_begins.push_back(layer == 0);
      const int a = int(rng() % 3 ? rng() % 2 : rng() % 6);
      const int b = (a + 1 + int(rng() % 5)) % 6;
      t.keys.push_back(layer * 6 + a);
      t.keys.push_back(layer * 6 + b);
    }
  t.group_begin.push_back(uint32_t(t.keys.size()));
  return t;
}

TEST(CacheSim, BothTiersPoliciesReplayThroughTheCommonInterface) {
  // The host policy (LFU with aging) and the GPU policy (LFRU) behind one CachePolicy reference:
  // the replay counts every access, the policy's own stats agree with it, and neither beats
  // Belady with bypass (both may serve a miss uncached).
  const CacheTrace t = two_layer_trace(300, 9);
  for (int capacity : {3, 5, 8}) {
    SCOPED_TRACE(capacity);
    LfuPolicy host{uint32_t(capacity)};
    LfruPolicy gpu(size_t(capacity), t.n_experts, std::vector<size_t>(2, 1));
    for (CachePolicy* p : {static_cast<CachePolicy*>(&host), static_cast<CachePolicy*>(&gpu)}) {
      const CacheSimResult r = simulate_policy(t, *p);
      EXPECT_EQ(r.accesses, t.keys.size());
      EXPECT_EQ(p->stats().demand_hits, r.hits);
      EXPECT_EQ(p->stats().demand_hits + p->stats().demand_misses, r.accesses);
      EXPECT_LE(r.hits, simulate_belady(t, capacity, true).hits);
      EXPECT_GT(r.hits, 0u);
    }
    // The wrappers are the same replay.
    EXPECT_EQ(simulate_lfu(t, capacity).hits, host.stats().demand_hits);
    EXPECT_EQ(simulate_lfru(t, capacity).hits, gpu.stats().demand_hits);
  }
  // Everything fits: both policies miss each expert once, as Belady does.
  const uint64_t cold = simulate_belady(t, 12).accesses - simulate_belady(t, 12).hits;
  EXPECT_EQ(simulate_lfu(t, 12).hits, t.keys.size() - cold);
  EXPECT_EQ(simulate_lfru(t, 12).hits, t.keys.size() - cold);
}

TEST(CacheSim, HostPolicyKeepsWhatItCountsAndTheGpuPolicyForgetsWhatCooled) {
  // Phase 1: experts 0 and 1 hot for 200 steps; phase 2: experts 2 and 3 for 40 steps, with
  // room for 2. The GPU policy's decaying heat hands the slots to the new pair within a few
  // steps; the host LFU's counts (no aging within this trace: a long period) keep the old pair,
  // whose 200 uses the new pair's 40 never reach: it misses all of phase 2.
  CacheTrace t = single_accesses(4, {});
  t.group_begin.clear();
  t.step_begins.clear();
  for (int s = 0; s < 240; ++s) {
    t.group_begin.push_back(uint32_t(t.keys.size()));
    t.step_begins.push_back(1);
    t.keys.push_back(s < 200 ? 0 : 2);
    t.keys.push_back(s < 200 ? 1 : 3);
  }
  t.group_begin.push_back(uint32_t(t.keys.size()));
  const uint64_t phase1_hits = 2 * 199;
  EXPECT_EQ(simulate_lfu(t, 2, uint64_t{1} << 30).hits, phase1_hits);
  EXPECT_GT(simulate_lfru(t, 2).hits, phase1_hits + 2 * 30);
  // Aging every 16 uses lets the host policy follow too.
  EXPECT_GT(simulate_lfu(t, 2, 16).hits, phase1_hits + 2 * 20);
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
