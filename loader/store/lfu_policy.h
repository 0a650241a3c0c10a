// The host expert cache's policy (a CachePolicy, loader/store/cache_policy.h) over a fixed number
// of equal slots: LFU with periodic aging, LRU among equal counts, counts remembered for evicted
// keys, pinned slots.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "loader/store/cache_policy.h"

namespace moestream {

// Heat is the aged count of demand uses. Admission: a fill takes a free slot, else the unpinned
// resident with the lowest count (least recently used among equals), unless that resident was
// used more often than the newcomer (a one-off expert never displaces a warm one); prefill fills
// free slots only. Not thread-safe: one owner (the expert store's fetching thread) drives it.
class LfuPolicy final : public CachePolicy {
 public:
  // Uses per slot between halvings. cache_sim's host-cache table replays routing logs through
  // this policy at 2/4/8/16: on decode traces no period won everywhere (4 led by up to 3 points
  // on the demo's, 8 by 2 on its 128-expert replay), so the period stays 8.
  static constexpr uint64_t kDefaultAgingSlots = 8;

  // aging_period: uses between halvings of every count (0: kDefaultAgingSlots * n_slots).
  // Halving lets a key that was hot long ago give way to one that is hot now, without forgetting
  // the ranking at once.
  explicit LfuPolicy(uint32_t n_slots, uint64_t aging_period = 0);

  uint32_t n_slots() const { return uint32_t(slots_.size()); }
  uint32_t size() const { return uint32_t(where_.size()); }  // keys resident

  int lookup(ExpertKey key, CacheFill kind) override;
  int slot_of(ExpertKey key) const override;
  std::optional<ExpertKey> victim(ExpertKey key) const override;
  bool admits(ExpertKey key, CacheFill kind, ExpertKey victim) const override;
  // Refusals: kNoRoom (every slot pinned, prefill without a free slot, a demand miss used less
  // often than the victim) or kDropped (the same for a speculative fill); nothing changes then.
  CacheAccess insert(ExpertKey key, CacheFill kind) override;
  void pin(int slot) override;
  void unpin(int slot) override;
  void advance_step() override {}  // ages by uses, not by steps
  double heat(ExpertKey key) const override { return double(count(key)); }
  const CacheStats& stats() const override { return stats_; }

  // Drops `key` (its data turned out bad); its slot becomes free. No-op when absent.
  void erase(ExpertKey key);
  uint32_t count(ExpertKey key) const;  // current (aged) demand-use count, resident or not

 private:
  struct Slot {
    ExpertKey key;
    uint64_t tick = 0;  // last use
    uint32_t pins = 0;
    bool used = false;
    bool speculative_unused = false;  // filled by a prediction, not yet demanded
  };
  using Rank = std::tuple<uint32_t, uint64_t, uint32_t>;  // (count, tick, slot): lowest goes first

  void touch(uint64_t key);
  void age();
  Rank rank(uint32_t slot) const;
  void make_evictable(uint32_t slot);
  void make_unevictable(uint32_t slot);

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::unordered_map<uint64_t, uint32_t> where_;   // ExpertKey::packed() -> slot
  std::unordered_map<uint64_t, uint32_t> counts_;  // packed key -> aged use count (resident or not)
  std::set<Rank> evictable_;                       // used, unpinned slots
  uint64_t tick_ = 0, aging_period_ = 0, uses_since_aging_ = 0;
  CacheStats stats_;
};

}  // namespace moestream
