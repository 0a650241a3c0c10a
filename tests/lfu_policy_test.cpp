// Tests of loader/store/lfu_policy.h and loader/store/host_cache.h: the host expert cache's eviction policy
// (LFU with aging, LRU ties, admission, pins, erase) and its aligned slot arena.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "loader/store/host_cache.h"
#include "loader/store/lfu_policy.h"

using namespace moestream;

namespace {

ExpertKey k(int expert) { return ExpertKey{0, expert}; }

// A use of `key` as the store makes it: lookup, and insert on a miss. Returns the slot or nullopt.
std::optional<uint32_t> use(LfuPolicy& p, int key, std::optional<ExpertKey>* evicted = nullptr) {
  if (const int s = p.lookup(k(key), CacheFill::kDemand); s >= 0) return uint32_t(s);
  const CacheAccess a = p.insert(k(key), CacheFill::kDemand);
  if (evicted) *evicted = a.evicted;
  if (a.outcome != CacheOutcome::kFilled) return std::nullopt;
  return uint32_t(a.slot);
}

// An insert of absent `key` (no use counted): the slot or nullopt.
std::optional<uint32_t> insert(LfuPolicy& p, int key) {
  const CacheAccess a = p.insert(k(key), CacheFill::kDemand);
  if (a.outcome != CacheOutcome::kFilled) return std::nullopt;
  return uint32_t(a.slot);
}

bool resident(const LfuPolicy& p, int key) { return p.slot_of(k(key)) >= 0; }

TEST(LfuPolicy, FreeSlotsFillBeforeAnythingIsEvicted) {
  LfuPolicy p(3);
  std::optional<ExpertKey> ev;
  EXPECT_EQ(use(p, 10, &ev), 0u);
  EXPECT_EQ(use(p, 11, &ev), 1u);
  EXPECT_EQ(use(p, 12, &ev), 2u);
  EXPECT_FALSE(ev.has_value());
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p.lookup(k(11), CacheFill::kDemand), 1);
}

TEST(LfuPolicy, DefaultAgingHalvesCountsEveryEightUsesPerSlot) {
  LfuPolicy p(2);  // period 8 * 2 = 16 uses
  for (int i = 0; i < 15; ++i) use(p, 1);
  EXPECT_EQ(p.count(k(1)), 15u);
  use(p, 1);  // the 16th use: 16 halves to 8
  EXPECT_EQ(p.count(k(1)), 8u);
}

// Which key a full two-slot cache gives up for key 3 after each history of uses.
TEST(LfuPolicy, EvictsTheLeastFrequentlyUsedKeyThenTheLeastRecentlyUsed) {
  struct Case {
    const char* why;
    std::vector<int> history;
    int evicted, kept;
  };
  const Case cases[] = {
      {"2 (count 1) goes, not 1 (count 3), though 1 is older", {1, 1, 1, 2}, 2, 1},
      {"1 and 2 both count 1; 1 was used longer ago", {1, 2}, 1, 2},
  };
  for (const Case& c : cases) {
    LfuPolicy p(2, 1000);
    for (int key : c.history) use(p, key);
    std::optional<ExpertKey> ev;
    EXPECT_TRUE(use(p, 3, &ev).has_value()) << c.why;
    ASSERT_TRUE(ev.has_value()) << c.why;
    EXPECT_EQ(ev->expert, c.evicted) << c.why;
    EXPECT_FALSE(resident(p, c.evicted)) << c.why;
    EXPECT_TRUE(resident(p, c.kept)) << c.why;
    EXPECT_TRUE(resident(p, 3)) << c.why;
  }
}

TEST(LfuPolicy, OneOffKeyNeverDisplacesAWarmResident) {
  LfuPolicy p(1, 1000);
  for (int i = 0; i < 5; ++i) use(p, 7);
  EXPECT_EQ(use(p, 8), std::nullopt);  // count 1 < 5: not admitted
  EXPECT_TRUE(resident(p, 7));
  // A key that keeps coming earns its place once its count passes the resident's.
  std::optional<uint32_t> got;
  for (int i = 0; i < 5 && !got; ++i) got = use(p, 8);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(resident(p, 7));
}

TEST(LfuPolicy, AgingLetsANewlyHotKeyReplaceOneThatWasHotLongAgo) {
  LfuPolicy aged(1, 16), unaged(1, 1u << 30);
  for (LfuPolicy* p : {&aged, &unaged}) {
    for (int i = 0; i < 200; ++i) use(*p, 1);  // hot in the past
    for (int i = 0; i < 40; ++i) use(*p, 2);   // hot now
  }
  EXPECT_TRUE(resident(aged, 2)) << "halving counts forgets old popularity";
  EXPECT_TRUE(resident(unaged, 1)) << "without aging 200 uses outweigh 40 forever";
  EXPECT_LT(aged.count(k(1)), 200u);
}

TEST(LfuPolicy, EvictedKeyKeepsItsCountAndComesBackAhead) {
  LfuPolicy p(1, 1000);
  for (int i = 0; i < 3; ++i) use(p, 1);
  for (int i = 0; i < 4; ++i) use(p, 2);  // 2 overtakes 1 and takes the slot
  ASSERT_TRUE(resident(p, 2));
  EXPECT_EQ(p.count(k(1)), 3u);
  for (int i = 0; i < 2; ++i) use(p, 1);  // 5 > 4: back in after two more uses, not five
  EXPECT_TRUE(resident(p, 1));
}

TEST(LfuPolicy, PinnedSlotIsNeverEvicted) {
  LfuPolicy p(2, 1000);
  uint32_t a = *use(p, 1), b = *use(p, 2);
  p.pin(a);
  p.pin(b);
  for (int i = 0; i < 10; ++i) p.lookup(k(3), CacheFill::kDemand);  // much hotter than both
  EXPECT_EQ(insert(p, 3), std::nullopt) << "every slot pinned";
  p.unpin(b);
  EXPECT_EQ(insert(p, 3), b);
  EXPECT_TRUE(resident(p, 1));
  p.pin(b);
  p.pin(a);  // pins nest
  p.unpin(a);
  for (int i = 0; i < 30; ++i) p.lookup(k(4), CacheFill::kDemand);
  EXPECT_EQ(insert(p, 4), std::nullopt) << "still pinned once";
  p.unpin(a);
  EXPECT_EQ(insert(p, 4), a);
}

TEST(LfuPolicy, ErasedKeyFreesItsSlotEvenWhenErasedWhilePinned) {
  LfuPolicy p(2, 1000);
  uint32_t a = *use(p, 1);
  use(p, 2);
  p.erase(k(2));
  EXPECT_FALSE(resident(p, 2));
  EXPECT_EQ(p.size(), 1u);
  EXPECT_TRUE(use(p, 3).has_value());  // the freed slot, no eviction
  EXPECT_TRUE(resident(p, 1));
  p.pin(a);
  p.erase(k(1));
  EXPECT_FALSE(resident(p, 1));
  for (int i = 0; i < 5; ++i) p.lookup(k(3), CacheFill::kDemand);
  EXPECT_EQ(insert(p, 9), std::nullopt) << "slot of an erased but pinned key is not reused yet";
  p.unpin(a);
  EXPECT_EQ(insert(p, 9), a);
}

TEST(LfuPolicy, VictimAndAdmissionAnswerWhatInsertWillDo) {
  LfuPolicy p(2, 1000);
  EXPECT_FALSE(p.victim(k(1)).has_value()) << "free slots: nothing is displaced";
  for (int i = 0; i < 3; ++i) use(p, 1);
  use(p, 2);
  ASSERT_EQ(p.victim(k(3)), k(2));  // count 1 below 1's 3
  EXPECT_FALSE(p.admits(k(3), CacheFill::kPrefill, k(2))) << "prefill never evicts";
  EXPECT_FALSE(p.admits(k(3), CacheFill::kDemand, k(2)));  // 0 uses of 3 yet, 2 has 1
  p.lookup(k(3), CacheFill::kDemand);
  EXPECT_TRUE(p.admits(k(3), CacheFill::kDemand, k(2)));  // 1 use each: equals may displace
  EXPECT_FALSE(p.admits(k(3), CacheFill::kDemand, k(1)));
  const CacheAccess a = p.insert(k(3), CacheFill::kDemand);
  EXPECT_EQ(a.outcome, CacheOutcome::kFilled);
  EXPECT_EQ(a.evicted, k(2));
  p.pin(p.slot_of(k(1)));
  p.pin(p.slot_of(k(3)));
  EXPECT_FALSE(p.victim(k(4)).has_value()) << "every slot pinned";
}

TEST(LfuPolicy, OnlyDemandHeatsAndPrefillNeverEvicts) {
  LfuPolicy p(2, 1000);
  EXPECT_EQ(p.access(k(1), CacheFill::kPrefill).outcome, CacheOutcome::kFilled);  // free slot
  EXPECT_EQ(p.access(k(1), CacheFill::kPrefill).outcome, CacheOutcome::kHit);
  EXPECT_EQ(p.count(k(1)), 0u) << "a prompt's uses say nothing about decode";
  use(p, 2);
  EXPECT_EQ(p.access(k(3), CacheFill::kPrefill).outcome, CacheOutcome::kNoRoom);
  const CacheAccess spec = p.access(k(5), CacheFill::kSpeculative);
  EXPECT_EQ(spec.outcome, CacheOutcome::kFilled) << "1 (0 uses) may go";
  EXPECT_EQ(spec.evicted, k(1));
  use(p, 5);  // the prediction is used
  EXPECT_EQ(p.access(k(4), CacheFill::kSpeculative).outcome, CacheOutcome::kDropped)
      << "a prediction (0 uses) does not displace 2 or 5 (1 use each)";
  const CacheStats& s = p.stats();
  EXPECT_EQ(s.prefill_fills, 1u);
  EXPECT_EQ(s.prefill_hits, 1u);
  EXPECT_EQ(s.prefill_no_room, 1u);
  EXPECT_EQ(s.speculative_dropped, 1u);
  EXPECT_EQ(s.speculative_fills, 1u);
  EXPECT_EQ(s.speculative_used, 1u);
  EXPECT_EQ(s.demand_hits, 1u);
  EXPECT_EQ(s.demand_misses, 1u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_DOUBLE_EQ(p.heat(k(5)), 1.0);
}

TEST(LfuPolicy, RefusedDemandMissIsCountedAsNotAdmitted) {
  LfuPolicy p(1, 1000);
  for (int i = 0; i < 3; ++i) use(p, 7);
  EXPECT_EQ(use(p, 8), std::nullopt);
  EXPECT_EQ(p.stats().demand_misses, 2u);
  EXPECT_EQ(p.stats().demand_no_room, 1u);
  EXPECT_EQ(p.stats().demand_not_admitted, 1u);
  EXPECT_EQ(p.stats().demand_hits, 2u);
}

TEST(HostCache, SlotsAreAlignedAndSizedByTheBudget) {
  HostCache c(10 * 8192 + 100, 5000);  // 5000 B rounds up to 8 KiB slots
  EXPECT_EQ(c.slot_bytes(), 8192u);
  EXPECT_EQ(c.n_slots(), 10u);
  for (uint32_t s = 0; s < c.n_slots(); ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.slot_data(s)) % 4096, 0u);
    c.slot_data(s)[c.slot_bytes() - 1] = uint8_t(s);  // writable to the end
  }
  EXPECT_NE((ExpertKey{1, 2}).packed(), (ExpertKey{2, 1}).packed());
  HostCache none(4000, 5000);
  EXPECT_EQ(none.n_slots(), 0u);
  EXPECT_EQ(insert(none.policy(), 1), std::nullopt);
}

}  // namespace
