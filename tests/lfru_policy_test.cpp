// The GPU expert cache policy (loader/store/lfru_policy.h): LFRU victims, decaying heat, the
// eviction guard, admission, pinning, size classes, prefill without eviction. Plain C++: CI.
#include "loader/store/lfru_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error.h"

namespace moestream {
namespace {

constexpr size_t kBytes = 1000;  // one expert of the single-class tests

LfruPolicy one_class(int slots, int n_experts = 16, int n_layers = 1,
                     LfruPolicyOptions options = {}) {
  return LfruPolicy(kBytes * size_t(slots), n_experts, std::vector<size_t>(size_t(n_layers), kBytes),
                        options);
}

LfruPolicyOptions half_life(uint32_t steps, bool admission = false) {
  LfruPolicyOptions o;
  o.heat_half_life_steps = steps;
  o.demand_admission = admission;
  return o;
}

void steps(LfruPolicy& p, int n) {
  for (int i = 0; i < n; ++i) p.advance_step();
}

constexpr uint64_t kUnit = uint64_t{1} << LfruPolicy::kHeatFracBits;

int evicted_layer(const CacheAccess& a) { return a.evicted ? a.evicted->layer : -1; }
int evicted_expert(const CacheAccess& a) { return a.evicted ? a.evicted->expert : -1; }

void demand(LfruPolicy& p, int expert, int times, int layer = 0) {
  for (int i = 0; i < times; ++i) p.access({layer, expert}, CacheFill::kDemand);
}

TEST(LfruPolicy, WarmResidentSurvivesPredictionForNeverSeenExpert) {
  auto p = one_class(2);
  demand(p, 0, 5);
  demand(p, 1, 6);
  const auto r = p.access({0, 7}, CacheFill::kSpeculative);
  EXPECT_EQ(r.outcome, CacheOutcome::kDropped);
  EXPECT_EQ(r.slot, -1);            // nothing to copy
  EXPECT_EQ(evicted_expert(r), -1);  // nothing evicted
  EXPECT_GE(p.slot_of({0, 0}), 0);
  EXPECT_GE(p.slot_of({0, 1}), 0);
  EXPECT_EQ(p.slot_of({0, 7}), -1);
  EXPECT_EQ(p.stats().speculative_dropped, 1u);
  EXPECT_EQ(p.stats().speculative_fills, 0u);
  EXPECT_EQ(p.stats().evictions, 0u);
}

// The fills that evict the only resident: a prediction once the resident was demanded just once
// (never guarded), a demand fill even when the resident is warm.
TEST(LfruPolicy, OnceDemandedResidentIsEvictedForPredictionAndWarmOneForDemand) {
  struct Case {
    CacheFill kind;
    int resident_demands;
  };
  for (const Case c : {Case{CacheFill::kSpeculative, 1}, Case{CacheFill::kDemand, 50}}) {
    const bool speculative = c.kind == CacheFill::kSpeculative;
    SCOPED_TRACE(speculative ? "prediction" : "demand");
    auto p = one_class(1);
    demand(p, 0, c.resident_demands);
    const auto r = p.access({0, 5}, c.kind);
    ASSERT_EQ(r.outcome, CacheOutcome::kFilled);
    EXPECT_EQ(evicted_layer(r), 0);
    EXPECT_EQ(evicted_expert(r), 0);
    EXPECT_FALSE(r.slot_allocated);  // the slot is reused in place
    EXPECT_EQ(p.slot_of({0, 5}), r.slot);
    EXPECT_EQ(p.slot_of({0, 0}), -1);
    EXPECT_EQ(p.stats().speculative_fills, speculative ? 1u : 0u);
    EXPECT_EQ(p.stats().evictions, 1u);
  }
}

// heat_v > 1.25 * heat_p + 4 keeps the resident; equality does not.
TEST(LfruPolicy, GuardNeedsHeatAboveQuarterMorePlusFour) {
  for (int victim_heat : {9, 10}) {
    auto p = one_class(1);
    demand(p, 1, 4);            // the prediction's heat: 4 (then evicted by expert 0)
    demand(p, 0, victim_heat);  // resident
    ASSERT_EQ(p.slot_of({0, 1}), -1);
    const auto r = p.access({0, 1}, CacheFill::kSpeculative);
    EXPECT_EQ(r.outcome, victim_heat == 9 ? CacheOutcome::kFilled : CacheOutcome::kDropped)
        << "victim heat " << victim_heat << " vs prediction heat 4 (threshold 9)";
  }
  // A resident with a single demand access is never guarded, even against a cold prediction.
  auto p = one_class(1);
  demand(p, 0, 1);
  EXPECT_EQ(p.access({0, 9}, CacheFill::kSpeculative).outcome, CacheOutcome::kFilled);
}

TEST(LfruPolicy, PinnedSlotsAreNeverVictims) {
  auto p = one_class(3);
  demand(p, 0, 1);  // coldest: lowest heat
  demand(p, 1, 3);
  demand(p, 2, 4);
  const int cold = p.slot_of({0, 0});
  p.pin(cold);
  auto r = p.access({0, 3}, CacheFill::kDemand);
  ASSERT_EQ(r.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(evicted_expert(r), 1);  // the coldest unpinned
  EXPECT_EQ(p.slot_of({0, 0}), cold);
  // Everything pinned: no victim at all, for demand and prediction alike.
  p.pin(p.slot_of({0, 2}));
  p.pin(p.slot_of({0, 3}));
  EXPECT_EQ(p.access({0, 4}, CacheFill::kDemand).outcome, CacheOutcome::kNoRoom);
  EXPECT_EQ(p.access({0, 5}, CacheFill::kSpeculative).outcome, CacheOutcome::kNoRoom);
  EXPECT_EQ(p.stats().demand_no_room, 1u);
  p.unpin(cold);
  r = p.access({0, 4}, CacheFill::kDemand);
  EXPECT_EQ(r.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(evicted_expert(r), 0);
}

TEST(LfruPolicy, VictimHasLowestLfruScoreFrequencyBeforeRecency) {
  // Without decay, the layout in whole units: heat << (16 fraction bits + 8) | recency byte.
  auto p = one_class(2, 16, 1, half_life(0));
  demand(p, 0, 3);  // hotter but older
  steps(p, 10);
  demand(p, 1, 1);  // recent but cold
  EXPECT_EQ(p.score(p.slot_of({0, 0})), (3 * kUnit << 8) | (255 - 10));
  EXPECT_EQ(p.score(p.slot_of({0, 1})), (1 * kUnit << 8) | 255);
  EXPECT_EQ(evicted_expert(p.access({0, 2}, CacheFill::kDemand)), 1);
  // Equal heat: the older one goes; recency saturates at 255 steps.
  auto q = one_class(2, 16, 1, half_life(0));
  demand(q, 0, 2);
  q.advance_step();
  demand(q, 1, 2);
  EXPECT_EQ(evicted_expert(q.access({0, 2}, CacheFill::kDemand)), 0);
  steps(q, 1000);
  EXPECT_EQ(q.score(q.slot_of({0, 1})), 2 * kUnit << 8);
  // With decay the high bits hold the decayed heat: 3 accesses 10 steps ago at H = 16 are worth
  // 3 * 2^(-10/16) units, still above one fresh access.
  auto d = one_class(2);
  ASSERT_EQ(d.options().heat_half_life_steps, 16u);
  demand(d, 0, 3);
  steps(d, 10);
  demand(d, 1, 1);
  const uint64_t h0 = d.heat_fixed({0, 0});
  EXPECT_NEAR(double(h0), 3 * std::exp2(-10.0 / 16) * double(kUnit), 2.0);
  EXPECT_EQ(d.score(d.slot_of({0, 0})), (h0 << 8) | (255 - 10));
  EXPECT_EQ(d.score(d.slot_of({0, 1})), (kUnit << 8) | 255);
  EXPECT_EQ(evicted_expert(d.access({0, 2}, CacheFill::kDemand)), 1);
}

TEST(LfruPolicy, HeatHalvesEveryHalfLife) {
  auto p = one_class(2, 16, 1, half_life(16));
  demand(p, 0, 1);
  EXPECT_EQ(p.heat_fixed({0, 0}), kUnit);
  steps(p, 8);
  EXPECT_NEAR(p.heat({0, 0}), std::sqrt(0.5), 1e-4);
  steps(p, 8);
  EXPECT_EQ(p.heat_fixed({0, 0}), kUnit / 2);  // whole half-lives are exact
  steps(p, 16);
  EXPECT_EQ(p.heat_fixed({0, 0}), kUnit / 4);
  demand(p, 0, 1);  // a fresh access adds one unit to what is left
  EXPECT_EQ(p.heat_fixed({0, 0}), kUnit + kUnit / 4);
  EXPECT_EQ(p.demand_accesses({0, 0}), 2u);  // the raw count never decays
  steps(p, 64 * 16);
  EXPECT_EQ(p.heat_fixed({0, 0}), 0u);
  EXPECT_EQ(p.demand_accesses({0, 0}), 2u);
  // Half-life 0: no decay at all.
  auto q = one_class(2, 16, 1, half_life(0));
  demand(q, 0, 5);
  steps(q, 5000);
  EXPECT_EQ(q.heat_fixed({0, 0}), 5 * kUnit);
}

TEST(LfruPolicy, StaleHotExpertIsEvictedBeforeANewlyPopularOne) {
  // Expert 0 was hot long ago (20 accesses), expert 1 is in use now (3 accesses, one a step).
  for (uint32_t h : {16u, 0u}) {
    auto p = one_class(2, 16, 1, half_life(h));
    for (int i = 0; i < 20; ++i, p.advance_step()) demand(p, 0, 1);
    steps(p, 100);
    for (int i = 0; i < 3; ++i, p.advance_step()) demand(p, 1, 1);
    const auto r = p.access({0, 2}, CacheFill::kDemand);
    ASSERT_EQ(r.outcome, CacheOutcome::kFilled);
    // Decayed: 20 accesses >= 100 steps ago are worth < 0.2 units, below expert 1's ~2.7.
    // Undecayed (LFU), the stale expert keeps its slot.
    EXPECT_EQ(evicted_expert(r), h ? 0 : 1) << "half-life " << h;
  }
}

TEST(LfruPolicy, GuardComparesDecayedHeatAndCountsRawAccesses) {
  // Ten accesses long ago: still >= 2 raw demand accesses, but the decayed heat (< 4 units) is
  // not 4 units above a never-seen prediction, so the prediction displaces it.
  auto p = one_class(1);
  demand(p, 0, 10);
  steps(p, 32);  // 10 -> 2.5 units
  EXPECT_EQ(p.access({0, 7}, CacheFill::kSpeculative).outcome, CacheOutcome::kFilled);
  // The same ten accesses one half-life ago (5 units): 4 * 5 > 16, guarded.
  auto q = one_class(1);
  demand(q, 0, 10);
  steps(q, 16);
  EXPECT_EQ(q.access({0, 7}, CacheFill::kSpeculative).outcome, CacheOutcome::kDropped);
  // One raw demand access is never guarded, against even a never-seen prediction.
  auto r = one_class(1, 16, 1, half_life(0));
  demand(r, 0, 1);
  EXPECT_EQ(r.access({0, 9}, CacheFill::kSpeculative).outcome, CacheOutcome::kFilled);
}

TEST(LfruPolicy, AdmissionServesAColdDemandMissWithoutASlot) {
  auto p = one_class(2, 16, 1, half_life(16, true));
  demand(p, 0, 5);
  demand(p, 1, 5);
  p.advance_step();
  auto r = p.access({0, 3}, CacheFill::kDemand);  // one fresh access vs ~4.8 units
  EXPECT_EQ(r.outcome, CacheOutcome::kNoRoom);
  EXPECT_EQ(r.slot, -1);
  EXPECT_EQ(evicted_expert(r), -1);
  EXPECT_GE(p.slot_of({0, 0}), 0);
  EXPECT_GE(p.slot_of({0, 1}), 0);
  EXPECT_EQ(p.stats().demand_not_admitted, 1u);
  EXPECT_EQ(p.stats().demand_no_room, 1u);
  EXPECT_EQ(p.stats().evictions, 0u);
  EXPECT_EQ(p.demand_accesses({0, 3}), 1u);  // a refused miss still heats
  // Once it is hotter than the coldest resident, it is admitted and evicts it.
  for (int i = 0; i < 4; ++i) demand(p, 3, 1);
  EXPECT_GE(p.slot_of({0, 3}), 0);
  // Free budget is always used, admission or not.
  auto q = one_class(2, 16, 1, half_life(16, true));
  demand(q, 0, 5);
  EXPECT_EQ(q.access({0, 3}, CacheFill::kDemand).outcome, CacheOutcome::kFilled);
  // Without the option (default) the same miss evicts.
  auto d = one_class(2);
  demand(d, 0, 5);
  demand(d, 1, 5);
  d.advance_step();
  EXPECT_EQ(d.access({0, 3}, CacheFill::kDemand).outcome, CacheOutcome::kFilled);
}

TEST(LfruPolicy, AdmissionAcrossClassesReleasesNothingWhenRefused) {
  // Class 0 (100 B) holds the whole budget with warm experts; class 1 (300 B) owns no slot.
  LfruPolicyOptions o;
  o.demand_admission = true;
  LfruPolicy p(1000, 16, {100, 300}, o);
  for (int e = 0; e < 10; ++e) demand(p, e, 3, 0);
  const auto r = p.access({1, 0}, CacheFill::kDemand);
  EXPECT_EQ(r.outcome, CacheOutcome::kNoRoom);
  EXPECT_TRUE(r.released_slots.empty());
  EXPECT_EQ(p.class_slots(0), 10);
  EXPECT_EQ(p.class_slots(1), 0);
  EXPECT_EQ(p.stats().slot_frees, 0u);
  demand(p, 0, 1, 1);  // 2 units: still colder
  EXPECT_EQ(p.slot_of({1, 0}), -1);
  // At 3 units it ties the coldest class-0 slots and, touched now, outranks them: admitted, three
  // class-0 slots released for its bytes.
  demand(p, 0, 1, 1);
  EXPECT_GE(p.slot_of({1, 0}), 0);
  EXPECT_EQ(p.class_slots(0), 7);
  EXPECT_EQ(p.stats().demand_not_admitted, 2u);
}

TEST(LfruPolicy, VictimAndAdmissionAnswerWhatInsertWillDo) {
  auto p = one_class(2);
  EXPECT_FALSE(p.victim({0, 9}).has_value()) << "free budget: nothing is displaced";
  demand(p, 0, 6);
  demand(p, 1, 1);
  ASSERT_EQ(p.victim({0, 9}), (ExpertKey{0, 1}));  // the colder one
  EXPECT_TRUE(p.admits({0, 9}, CacheFill::kSpeculative, {0, 1}));   // one access: no guard
  EXPECT_FALSE(p.admits({0, 9}, CacheFill::kSpeculative, {0, 0}));  // 6 > 1.25 * 0 + 4
  EXPECT_TRUE(p.admits({0, 9}, CacheFill::kDemand, {0, 0}));  // demand admission is off
  EXPECT_FALSE(p.admits({0, 9}, CacheFill::kPrefill, {0, 1}));
  const CacheAccess r = p.access({0, 9}, CacheFill::kSpeculative);
  EXPECT_EQ(r.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(r.evicted, (ExpertKey{0, 1}));
  // With admission on, a cold demand miss is refused exactly when admits() says so.
  auto q = one_class(1, 16, 1, half_life(16, true));
  demand(q, 0, 3);
  EXPECT_FALSE(q.admits({0, 5}, CacheFill::kDemand, {0, 0}));
  EXPECT_EQ(q.access({0, 5}, CacheFill::kDemand).outcome, CacheOutcome::kNoRoom);
  // Everything pinned: no victim.
  q.pin(q.slot_of({0, 0}));
  EXPECT_FALSE(q.victim({0, 5}).has_value());
}

TEST(LfruPolicy, AnswersThroughTheCommonInterface) {
  // The calls the host store and the simulator make, through a CachePolicy reference.
  auto p = one_class(1);
  CachePolicy& c = p;
  EXPECT_EQ(c.lookup({0, 3}, CacheFill::kDemand), -1);
  const CacheAccess a = c.insert({0, 3}, CacheFill::kDemand);
  ASSERT_EQ(a.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(c.lookup({0, 3}, CacheFill::kDemand), a.slot);
  EXPECT_EQ(c.slot_of({0, 3}), a.slot);
  EXPECT_DOUBLE_EQ(c.heat({0, 3}), 2.0);
  EXPECT_EQ(c.stats().demand_hits, 1u);
  EXPECT_EQ(c.stats().demand_misses, 1u);
}

TEST(LfruPolicy, HalfLifeAboveLimitIsAConfigError) {
  EXPECT_THROW(one_class(2, 16, 1, half_life(1u << 21)), ConfigError);
}

TEST(LfruPolicy, HeatCountsDemandAccessesOnly) {
  auto p = one_class(4);
  for (int i = 0; i < 5; ++i) {
    p.access({0, 0}, CacheFill::kSpeculative);
    p.access({0, 1}, CacheFill::kPrefill);
  }
  EXPECT_EQ(p.heat({0, 0}), 0.0);
  EXPECT_EQ(p.heat({0, 1}), 0.0);
  EXPECT_EQ(p.demand_accesses({0, 1}), 0u);
  demand(p, 0, 2);
  EXPECT_EQ(p.heat({0, 0}), 2.0);
  EXPECT_EQ(p.demand_accesses({0, 0}), 2u);
  EXPECT_EQ(p.stats().speculative_used, 1u);  // the prediction was hit by demand, counted once
  EXPECT_EQ(p.stats().speculative_hits, 4u);
}

TEST(LfruPolicy, PrefillFillsFreeSlotsButNeverEvicts) {
  auto p = one_class(2);
  EXPECT_EQ(p.access({0, 0}, CacheFill::kPrefill).outcome, CacheOutcome::kFilled);
  EXPECT_EQ(p.access({0, 1}, CacheFill::kPrefill).outcome, CacheOutcome::kFilled);
  for (int e = 2; e < 16; ++e)
    EXPECT_EQ(p.access({0, e}, CacheFill::kPrefill).outcome, CacheOutcome::kNoRoom);
  EXPECT_GE(p.slot_of({0, 0}), 0);
  EXPECT_GE(p.slot_of({0, 1}), 0);
  EXPECT_EQ(p.access({0, 1}, CacheFill::kPrefill).outcome, CacheOutcome::kHit);
  EXPECT_EQ(p.stats().evictions, 0u);
  EXPECT_EQ(p.stats().prefill_fills, 2u);
  EXPECT_EQ(p.stats().prefill_no_room, 14u);
  // A decode working set is not flushed by a long prompt either.
  auto q = one_class(2);
  demand(q, 7, 1);
  demand(q, 8, 1);
  for (int e = 0; e < 16; ++e) q.access({0, e}, CacheFill::kPrefill);
  EXPECT_GE(q.slot_of({0, 7}), 0);
  EXPECT_GE(q.slot_of({0, 8}), 0);
}

TEST(LfruPolicy, SizeClassesShareTheBudget) {
  // Layer 0: 100-byte experts, layer 1: 300-byte experts, 1000 bytes in all.
  LfruPolicy p(1000, 16, {100, 300});
  ASSERT_EQ(p.n_classes(), 2);
  for (int e = 0; e < 10; ++e) demand(p, e, 1 + (e == 0 ? 5 : 0), 0);  // class 0 takes it all
  EXPECT_EQ(p.class_slots(0), 10);
  EXPECT_EQ(p.bytes_allocated(), 1000u);
  // Class 1 owns nothing evictable: it takes the three coldest class-0 slots' bytes.
  const auto r = p.access({1, 0}, CacheFill::kDemand);
  ASSERT_EQ(r.outcome, CacheOutcome::kFilled);
  EXPECT_TRUE(r.slot_allocated);
  EXPECT_EQ(r.released_slots.size(), 3u);
  EXPECT_GE(p.slot_of({0, 0}), 0);  // the hot one stays
  EXPECT_EQ(p.class_slots(0), 7);
  EXPECT_EQ(p.class_slots(1), 1);
  EXPECT_EQ(p.bytes_allocated(), 1000u);
  // From now on class 1 recycles its own slot.
  const auto r2 = p.access({1, 1}, CacheFill::kDemand);
  EXPECT_EQ(r2.slot, r.slot);
  EXPECT_TRUE(r2.released_slots.empty());
  EXPECT_EQ(p.class_slots(0), 7);
}

TEST(LfruPolicy, AlternatingClassesCauseNoSlotChurn) {
  // Layers alternate q4-sized and q8-sized experts, as mixed-quant models do.
  LfruPolicy p(10 * 450, 32, {180, 340, 180, 340});
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(0, 31);
  uint64_t allocs_after_warmup = 0, frees_after_warmup = 0;
  for (int step = 0; step < 400; ++step) {
    for (int layer = 0; layer < 4; ++layer)
      for (int k = 0; k < 4; ++k) {
        p.access({layer, pick(rng)}, CacheFill::kDemand);
        ASSERT_LE(p.bytes_allocated(), p.budget_bytes());
      }
    p.advance_step();
    if (step == 50) {
      allocs_after_warmup = p.stats().slot_allocs;
      frees_after_warmup = p.stats().slot_frees;
    }
  }
  EXPECT_GT(p.stats().evictions, 1000u);  // the working set is far larger than the cache
  EXPECT_EQ(p.stats().slot_allocs, allocs_after_warmup);
  EXPECT_EQ(p.stats().slot_frees, frees_after_warmup);
  EXPECT_EQ(p.stats().slot_frees, 0u);
  EXPECT_GT(p.class_slots(0), 0);
  EXPECT_GT(p.class_slots(1), 0);
}

TEST(LfruPolicy, OutOfRangeExpertIsAConfigError) {
  auto p = one_class(2, 8, 2);
  EXPECT_THROW(p.access({0, 8}, CacheFill::kDemand), ConfigError);
  EXPECT_THROW(p.access({2, 0}, CacheFill::kSpeculative), ConfigError);
  EXPECT_THROW(p.access({-1, 0}, CacheFill::kDemand), ConfigError);
  EXPECT_THROW(LfruPolicy(100, 8, {}), ConfigError);
}

}  // namespace
}  // namespace moestream
