// Tests of loader/store/lfu_policy.h and loader/store/host_cache.h: the host expert cache's eviction policy
// (LFU with aging, LRU ties, admission, pins, erase) and its aligned slot arena.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

#include "loader/store/host_cache.h"
#include "loader/store/lfu_policy.h"

using namespace moestream;

namespace {

// A use of `key` as the store makes it: lookup, and insert on a miss. Returns the slot or nullopt.
std::optional<uint32_t> use(LfuPolicy& p, uint64_t key, std::optional<uint64_t>* evicted = nullptr) {
  if (auto s = p.lookup(key)) return s;
  return p.insert(key, evicted);
}

TEST(LfuPolicy, FreeSlotsFillBeforeAnythingIsEvicted) {
  LfuPolicy p(3);
  std::optional<uint64_t> ev;
  EXPECT_EQ(use(p, 10, &ev), 0u);
  EXPECT_EQ(use(p, 11, &ev), 1u);
  EXPECT_EQ(use(p, 12, &ev), 2u);
  EXPECT_FALSE(ev.has_value());
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p.lookup(11), 1u);
}

TEST(LfuPolicy, DefaultAgingHalvesCountsEveryEightUsesPerSlot) {
  LfuPolicy p(2);  // period 8 * 2 = 16 uses
  for (int i = 0; i < 15; ++i) use(p, 1);
  EXPECT_EQ(p.count(1), 15u);
  use(p, 1);  // the 16th use: 16 halves to 8
  EXPECT_EQ(p.count(1), 8u);
}

TEST(LfuPolicy, EvictsTheLeastFrequentlyUsedKey) {
  LfuPolicy p(2, 1000);
  for (int i = 0; i < 3; ++i) use(p, 1);
  use(p, 2);
  std::optional<uint64_t> ev;
  EXPECT_TRUE(use(p, 3, &ev).has_value());  // 2 (count 1) goes, not 1 (count 3), though 1 is older
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(*ev, 2u);
  EXPECT_TRUE(p.peek(1).has_value());
  EXPECT_FALSE(p.peek(2).has_value());
}

TEST(LfuPolicy, LeastRecentlyUsedGoesFirstAmongEqualCounts) {
  LfuPolicy p(2, 1000);
  use(p, 1);
  use(p, 2);
  std::optional<uint64_t> ev;
  use(p, 3, &ev);  // 1 and 2 both count 1; 1 was used longer ago
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(*ev, 1u);
  EXPECT_TRUE(p.peek(2).has_value());
  EXPECT_TRUE(p.peek(3).has_value());
}

TEST(LfuPolicy, OneOffKeyNeverDisplacesAWarmResident) {
  LfuPolicy p(1, 1000);
  for (int i = 0; i < 5; ++i) use(p, 7);
  EXPECT_EQ(use(p, 8), std::nullopt);  // count 1 < 5: not admitted
  EXPECT_TRUE(p.peek(7).has_value());
  // A key that keeps coming earns its place once its count passes the resident's.
  std::optional<uint32_t> got;
  for (int i = 0; i < 5 && !got; ++i) got = use(p, 8);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(p.peek(7).has_value());
}

TEST(LfuPolicy, AgingLetsANewlyHotKeyReplaceOneThatWasHotLongAgo) {
  LfuPolicy aged(1, 16), unaged(1, 1u << 30);
  for (LfuPolicy* p : {&aged, &unaged}) {
    for (int i = 0; i < 200; ++i) use(*p, 1);  // hot in the past
    for (int i = 0; i < 40; ++i) use(*p, 2);   // hot now
  }
  EXPECT_TRUE(aged.peek(2).has_value()) << "halving counts forgets old popularity";
  EXPECT_TRUE(unaged.peek(1).has_value()) << "without aging 200 uses outweigh 40 forever";
  EXPECT_LT(aged.count(1), 200u);
}

TEST(LfuPolicy, EvictedKeyKeepsItsCountAndComesBackAhead) {
  LfuPolicy p(1, 1000);
  for (int i = 0; i < 3; ++i) use(p, 1);
  for (int i = 0; i < 4; ++i) use(p, 2);  // 2 overtakes 1 and takes the slot
  ASSERT_TRUE(p.peek(2).has_value());
  EXPECT_EQ(p.count(1), 3u);
  for (int i = 0; i < 2; ++i) use(p, 1);  // 5 > 4: back in after two more uses, not five
  EXPECT_TRUE(p.peek(1).has_value());
}

TEST(LfuPolicy, PinnedSlotIsNeverEvicted) {
  LfuPolicy p(2, 1000);
  uint32_t a = *use(p, 1), b = *use(p, 2);
  p.pin(a);
  p.pin(b);
  for (int i = 0; i < 10; ++i) p.lookup(3);  // much hotter than both
  EXPECT_EQ(p.insert(3), std::nullopt) << "every slot pinned";
  p.unpin(b);
  EXPECT_EQ(p.insert(3), b);
  EXPECT_TRUE(p.peek(1).has_value());
  p.pin(b);
  p.pin(a);  // pins nest
  p.unpin(a);
  for (int i = 0; i < 30; ++i) p.lookup(4);
  EXPECT_EQ(p.insert(4), std::nullopt) << "still pinned once";
  p.unpin(a);
  EXPECT_EQ(p.insert(4), a);
}

TEST(LfuPolicy, ErasedKeyFreesItsSlotEvenWhenErasedWhilePinned) {
  LfuPolicy p(2, 1000);
  uint32_t a = *use(p, 1);
  use(p, 2);
  p.erase(2);
  EXPECT_FALSE(p.peek(2).has_value());
  EXPECT_EQ(p.size(), 1u);
  EXPECT_TRUE(use(p, 3).has_value());  // the freed slot, no eviction
  EXPECT_TRUE(p.peek(1).has_value());
  p.pin(a);
  p.erase(1);
  EXPECT_FALSE(p.peek(1).has_value());
  for (int i = 0; i < 5; ++i) p.lookup(3);
  EXPECT_EQ(p.insert(9), std::nullopt) << "slot of an erased but pinned key is not reused yet";
  p.unpin(a);
  EXPECT_EQ(p.insert(9), a);
}

TEST(HostCache, SlotsAreAlignedAndSizedByTheBudget) {
  HostCache c(10 * 8192 + 100, 5000);  // 5000 B rounds up to 8 KiB slots
  EXPECT_EQ(c.slot_bytes(), 8192u);
  EXPECT_EQ(c.n_slots(), 10u);
  for (uint32_t s = 0; s < c.n_slots(); ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.slot_data(s)) % 4096, 0u);
    c.slot_data(s)[c.slot_bytes() - 1] = uint8_t(s);  // writable to the end
  }
  EXPECT_NE(HostCache::key(1, 2), HostCache::key(2, 1));
  HostCache none(4000, 5000);
  EXPECT_EQ(none.n_slots(), 0u);
  EXPECT_EQ(none.policy().insert(1), std::nullopt);
}

}  // namespace
