// Tests of loader/store/foresight_policy.h (slots, pins, fill kinds, admission, what it learns
// from history and from the look-ahead's guesses, hostile keys and guesses) and of
// cluster/cache_hints.h (guesses replayed beside a trace).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "cluster/cache_hints.h"
#include "cluster/cache_sim.h"
#include "common/error.h"
#include "loader/store/foresight_policy.h"
#include "loader/store/lfu_policy.h"

namespace moestream {
namespace {

// One step of a 2-layer model: each layer's experts demanded, then the guess (if any) of the
// layer's next step given, the layer's slots pinned while it runs as the caches do.
void run_layer(ForesightPolicy& p, int layer, const std::vector<int>& ids,
               const std::vector<int>& guess_next_step = {}) {
  std::vector<int> pinned;
  for (int e : ids) {
    const CacheAccess a = p.access(ExpertKey{layer, e}, CacheFill::kDemand);
    if (a.slot >= 0) p.pin(a.slot), pinned.push_back(a.slot);
  }
  if (!guess_next_step.empty()) p.hint(layer, layer, guess_next_step);
  for (int s : pinned) p.unpin(s);
}

TEST(Foresight, FillsFreeSlotsThenEvictsOne) {
  ForesightPolicy p(2, 1, 8);
  EXPECT_EQ(p.access({0, 1}, CacheFill::kDemand).outcome, CacheOutcome::kFilled);
  EXPECT_EQ(p.access({0, 2}, CacheFill::kDemand).outcome, CacheOutcome::kFilled);
  EXPECT_EQ(p.access({0, 1}, CacheFill::kDemand).outcome, CacheOutcome::kHit);
  ForesightPolicyOptions no_adm;
  no_adm.admission = false;
  ForesightPolicy q(2, 1, 8, no_adm);
  q.access({0, 1}, CacheFill::kDemand);
  q.access({0, 2}, CacheFill::kDemand);
  const CacheAccess a = q.access({0, 3}, CacheFill::kDemand);
  ASSERT_EQ(a.outcome, CacheOutcome::kFilled);
  ASSERT_TRUE(a.evicted.has_value());
  EXPECT_TRUE(a.evicted->expert == 1 || a.evicted->expert == 2);
  EXPECT_EQ(q.slot_of(*a.evicted), -1);
  EXPECT_EQ(q.slot_of({0, 3}), a.slot);
  EXPECT_EQ(q.stats().evictions, 1u);
}

TEST(Foresight, PinnedSlotIsNeverTheVictimAndAllPinnedIsNoRoom) {
  ForesightPolicyOptions no_adm;
  no_adm.admission = false;
  ForesightPolicy p(2, 1, 8, no_adm);
  const int s1 = p.access({0, 1}, CacheFill::kDemand).slot;
  const int s2 = p.access({0, 2}, CacheFill::kDemand).slot;
  p.pin(s1);
  const CacheAccess a = p.access({0, 3}, CacheFill::kDemand);
  ASSERT_EQ(a.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(a.evicted->expert, 2);
  EXPECT_EQ(a.slot, s2);
  p.pin(a.slot);
  EXPECT_EQ(p.access({0, 4}, CacheFill::kDemand).outcome, CacheOutcome::kNoRoom);
  EXPECT_FALSE(p.victim({0, 4}).has_value());
}

TEST(Foresight, PrefillTakesFreeRoomOnly) {
  ForesightPolicy p(1, 1, 8);
  EXPECT_EQ(p.access({0, 1}, CacheFill::kPrefill).outcome, CacheOutcome::kFilled);
  EXPECT_EQ(p.access({0, 2}, CacheFill::kPrefill).outcome, CacheOutcome::kNoRoom);
  EXPECT_EQ(p.slot_of({0, 1}), 0);
}

TEST(Foresight, LearnsThatReusedExpertsComeBack) {
  // Layer 0: expert 0 every step, one new expert (1..) each step: the steady one must be worth
  // more than a one-off, and stay resident in a 2-slot cache while the one-offs pass through.
  ForesightPolicy p(2, 1, 64);
  for (int s = 0; s < 40; ++s) {
    run_layer(p, 0, {0, 1 + s});
    p.advance_step();
  }
  EXPECT_GT(p.reuse_probability({0, 0}), 0.8);
  EXPECT_LT(p.reuse_probability({0, 40}), 0.2);
  EXPECT_GE(p.slot_of({0, 0}), 0);
  EXPECT_GT(p.stats().demand_hits, 35u);
}

TEST(Foresight, AdmissionServesAColdMissUncached) {
  ForesightPolicy p(1, 1, 64);
  for (int s = 0; s < 20; ++s) {
    run_layer(p, 0, {0});
    p.advance_step();
  }
  // A one-off (never seen) is worth less than the expert used every step: no slot.
  p.access({0, 5}, CacheFill::kDemand);
  EXPECT_EQ(p.slot_of({0, 0}), 0);
  EXPECT_EQ(p.slot_of({0, 5}), -1);
  EXPECT_EQ(p.stats().demand_not_admitted, 1u);
  EXPECT_EQ(p.stats().demand_no_room, 1u);
}

TEST(Foresight, RightGuessesOutweighHistory) {
  // Two layers; layer 1 uses expert 0 or 1 at random each step: history says 50/50, the (always
  // right) guesses say which: one made at layer 0 of the same step, one at layer 1 of the step
  // before. Learned, the guessed expert is worth more than the other.
  std::mt19937 rng(5);
  std::vector<int> pick(62);
  for (int& x : pick) x = int(rng() % 2);
  ForesightPolicy p(8, 2, 4);
  for (int s = 0; s < 60; ++s) {
    run_layer(p, 0, {3});
    p.hint(0, 1, std::vector<int>{pick[size_t(s)]});
    run_layer(p, 1, {pick[size_t(s)]}, {pick[size_t(s) + 1]});
    p.advance_step();
  }
  const int next = pick[60], other = 1 - next;
  EXPECT_GT(p.reuse_probability({1, next}), 0.9);
  EXPECT_LT(p.reuse_probability({1, other}), 0.1);
  EXPECT_GT(p.value({1, next}), p.value({1, other}));
  // The freshest guess wins: made one layer ahead, it overrides the one from the step before.
  run_layer(p, 0, {3});
  p.hint(0, 1, std::vector<int>{other});
  EXPECT_GT(p.reuse_probability({1, other}), 0.9);
  EXPECT_LT(p.reuse_probability({1, next}), 0.1);
}

TEST(Foresight, HostileKeysGuessesAndOptionsThrow) {
  ForesightPolicy p(2, 2, 4);
  EXPECT_THROW(p.access({2, 0}, CacheFill::kDemand), ConfigError);
  EXPECT_THROW(p.access({0, 4}, CacheFill::kDemand), ConfigError);
  EXPECT_THROW(p.access({-1, 0}, CacheFill::kDemand), ConfigError);
  EXPECT_THROW(p.slot_of({0, -1}), ConfigError);
  EXPECT_THROW(p.hint(0, 2, std::vector<int>{0}), ConfigError);
  EXPECT_THROW(p.hint(2, 1, std::vector<int>{0}), ConfigError);
  EXPECT_THROW(p.hint(-1, 1, std::vector<int>{0}), ConfigError);
  EXPECT_THROW(p.hint(0, 1, std::vector<int>{4}), ConfigError);
  EXPECT_THROW(p.hint(0, 1, std::vector<int>{-1}), ConfigError);
  p.hint(0, 1, std::vector<int>{0, 0, 1});  // duplicates are harmless
  EXPECT_THROW(p.set_prior(std::vector<double>(7, 0.25)), ConfigError);
  EXPECT_THROW(p.set_prior(std::vector<double>{0.5, 0.5, 0, std::nan(""), 1, 0, 0, 0}), ConfigError);
  EXPECT_THROW(p.set_prior(std::vector<double>{0.5, 0.5, 0, -1, 1, 0, 0, 0}), ConfigError);
  p.set_prior(std::vector<double>{0.5, 0.5, 0, 0, 1, 0, 0, 0});
  EXPECT_THROW(ForesightPolicy(0, 1, 1), ConfigError);
  EXPECT_THROW(ForesightPolicy(1, 0, 1), ConfigError);
  EXPECT_THROW(ForesightPolicy(1, 1, 0), ConfigError);
  ForesightPolicyOptions bad;
  bad.heat_half_life_steps = 0;
  EXPECT_THROW(ForesightPolicy(1, 1, 1, bad), ConfigError);
  bad = {};
  bad.distance_exponent = -1;
  EXPECT_THROW(ForesightPolicy(1, 1, 1, bad), ConfigError);
}

// A 2-layer, 4-expert trace: steps of (layer 0, layer 1) groups of 2 experts each.
CacheTrace two_layer_trace(const std::vector<std::vector<int>>& steps) {
  CacheTrace t;
  t.n_layers = 2;
  t.n_experts = 4;
  for (const auto& s : steps)
    for (int l = 0; l < 2; ++l) {
      t.group_begin.push_back(uint32_t(t.keys.size()));
      t.step_begins.push_back(l == 0);
      t.keys.push_back(l * 4 + s[size_t(2 * l)]);
      t.keys.push_back(l * 4 + s[size_t(2 * l + 1)]);
    }
  t.group_begin.push_back(uint32_t(t.keys.size()));
  return t;
}

TEST(CacheHints, OracleGuessesAreTheTraceAtNoiseZero) {
  const CacheTrace t = two_layer_trace({{0, 1, 2, 3}, {1, 2, 0, 3}, {3, 0, 1, 2}});
  const CacheHints h = make_oracle_hints(t, 1, 0.0, 7);
  ASSERT_EQ(h.group_begin.size(), t.group_begin.size());
  ASSERT_EQ(h.width, 2);
  // Group 0 (step 0, layer 0): its next step's layer 0 {1, 2}, then this step's layer 1 {2, 3}.
  ASSERT_EQ(h.group_begin[1] - h.group_begin[0], 2u);
  EXPECT_EQ(h.layer[0], 0);
  EXPECT_EQ(std::vector<int>(h.experts.begin(), h.experts.begin() + 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(h.layer[1], 1);
  EXPECT_EQ(std::vector<int>(h.experts.begin() + 2, h.experts.begin() + 4), (std::vector<int>{2, 3}));
  // The last step has no next step: its layer 1 group guesses nothing.
  EXPECT_EQ(h.group_begin[6], h.group_begin[5]);
  // Noise 1: every id replaced by one the group does not use.
  const CacheHints n = make_oracle_hints(t, 0, 1.0, 7);
  EXPECT_NE(std::vector<int>(n.experts.begin(), n.experts.begin() + 2), (std::vector<int>{1, 2}));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(n.experts[size_t(i)] == 0 || n.experts[size_t(i)] == 3);
}

TEST(CacheHints, LookaheadRanksALaterRoutersScores) {
  RoutingLog log;
  log.header.n_layers = 2;
  log.header.n_experts = 3;
  log.header.top_k = 1;
  log.header.hidden = 2;
  RoutingRecord r;
  r.phase = RoutingPhase::kDecode;
  r.ids = {0};
  r.weights = {1};
  r.router_input = {1.0f, -1.0f};
  log.records.push_back(r);
  r.layer = 1;
  log.records.push_back(r);
  // Layer 1's router: scores x0 - x1 (2), -x0 (-1), x1 - 2 x0 (-3) for expert 0, 1, 2.
  const std::vector<std::vector<float>> routers{{1, 0, 0, 1, 0, 0}, {1, -1, -1, 0, -2, 1}};
  const CacheHints h = make_lookahead_hints(log, true, routers, 1, 2);
  ASSERT_EQ(h.group_begin, (std::vector<uint32_t>{0, 1, 1}));
  EXPECT_EQ(h.layer[0], 1);
  EXPECT_EQ(h.experts, (std::vector<int>{0, 1}));
  // The record's own router ranked too (self width 3): layer 0's router scores (1, -1, 0).
  const CacheHints s = make_lookahead_hints(log, true, routers, 1, 2, 3);
  ASSERT_EQ(s.width, 3);
  EXPECT_EQ(s.layer, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(std::vector<int>(s.experts.begin(), s.experts.begin() + 3), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(s.experts[5], -1);  // the narrower guess is padded
  // Hostile shapes: wrong router size, no router input, a width past n_experts.
  EXPECT_THROW(make_lookahead_hints(log, true, {{1, 0}, {1, 0}}, 1, 2), ConfigError);
  EXPECT_THROW(make_lookahead_hints(log, true, routers, 1, 4), ConfigError);
  log.records[1].router_input.clear();
  EXPECT_THROW(make_lookahead_hints(log, true, routers, 1, 2), ConfigError);
}

// Delegates to an LfuPolicy and records the guesses it is handed and how many accesses preceded.
class RecordingPolicy final : public CachePolicy {
 public:
  LfuPolicy inner{8};
  int accesses = 0;
  std::vector<std::vector<int>> seen;  // {accesses before, from layer, guessed layer, ids...}
  int lookup(ExpertKey k, CacheFill f) override {
    accesses += f == CacheFill::kDemand;
    return inner.lookup(k, f);
  }
  int slot_of(ExpertKey k) const override { return inner.slot_of(k); }
  std::optional<ExpertKey> victim(ExpertKey k) const override { return inner.victim(k); }
  bool admits(ExpertKey k, CacheFill f, ExpertKey v) const override { return inner.admits(k, f, v); }
  CacheAccess insert(ExpertKey k, CacheFill f) override { return inner.insert(k, f); }
  void pin(int s) override { inner.pin(s); }
  void unpin(int s) override { inner.unpin(s); }
  void advance_step() override {}
  void hint(int from, int layer, std::span<const int> ids) override {
    std::vector<int> r{accesses, from, layer};
    r.insert(r.end(), ids.begin(), ids.end());
    seen.push_back(r);
  }
  double heat(ExpertKey k) const override { return inner.heat(k); }
  const CacheStats& stats() const override { return inner.stats(); }
};

TEST(CacheHints, ReplayHandsEachGroupsGuessesToThePolicyBeforeItsAccesses) {
  const CacheTrace t = two_layer_trace({{0, 1, 2, 3}, {1, 2, 0, 3}});
  const CacheHints h = make_oracle_hints(t, 1, 0.0, 3);
  RecordingPolicy p;
  const CacheSimResult r = simulate_policy_with_hints(t, p, h);
  EXPECT_EQ(r.accesses, 8u);
  // Step 0 layer 0: its next step {1, 2} and layer 1 {2, 3}; step 0 layer 1: its next step
  // {0, 3}; step 1 layer 0: layer 1 {0, 3}; step 1 layer 1: nothing.
  const std::vector<std::vector<int>> want{
      {0, 0, 0, 1, 2}, {0, 0, 1, 2, 3}, {2, 1, 1, 0, 3}, {4, 0, 1, 0, 3}};
  EXPECT_EQ(p.seen, want);
  CacheHints wrong = h;
  wrong.group_begin.pop_back();
  RecordingPolicy other;
  EXPECT_THROW(simulate_policy_with_hints(t, other, wrong), ConfigError);
}

}  // namespace
}  // namespace moestream
