// Frequency-aware eviction over a fixed number of equal slots (the host expert cache): LFU with
// periodic aging, LRU among equal counts, counts remembered for evicted keys, pinned slots.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace moestream {

// Not thread-safe: one owner (the expert store's fetching thread) drives it.
class LfuPolicy {
 public:
  // Uses per slot between halvings. gpu_cache_sim's host-cache table replays routing logs
  // through this policy at 2/4/8/16: on decode traces no period won everywhere (4 led by up to
  // 3 points on the demo's, 8 by 2 on its 128-expert replay), so the period stays 8.
  static constexpr uint64_t kDefaultAgingSlots = 8;

  // aging_period: uses between halvings of every count (0: kDefaultAgingSlots * n_slots).
  // Halving lets a key that was hot long ago give way to one that is hot now, without forgetting
  // the ranking at once.
  explicit LfuPolicy(uint32_t n_slots, uint64_t aging_period = 0);

  uint32_t n_slots() const { return uint32_t(slots_.size()); }
  uint32_t size() const { return uint32_t(where_.size()); }  // keys resident

  // The slot holding `key`, counting one use; nullopt when absent (the use is still counted, so
  // a key that keeps missing earns its place).
  std::optional<uint32_t> lookup(uint64_t key);
  // The slot holding `key` without counting a use (residency queries).
  std::optional<uint32_t> peek(uint64_t key) const;

  // A slot for absent `key`: a free one, else the unpinned resident with the lowest count
  // (least recently used among equals), whose key is reported in *evicted. Nullopt, and nothing
  // changes, when every slot is pinned, or when admitting `key` would evict a key used more
  // often than it (a one-off expert never displaces a warm one).
  std::optional<uint32_t> insert(uint64_t key, std::optional<uint64_t>* evicted = nullptr);

  // Drops `key` (its data turned out bad); its slot becomes free. No-op when absent.
  void erase(uint64_t key);

  // A pinned slot is never evicted (its data is in use). Pins nest.
  void pin(uint32_t slot);
  void unpin(uint32_t slot);

  uint32_t count(uint64_t key) const;  // current (aged) use count, resident or not

 private:
  struct Slot {
    uint64_t key = 0;
    uint64_t tick = 0;  // last use
    uint32_t pins = 0;
    bool used = false;
  };
  using Rank = std::tuple<uint32_t, uint64_t, uint32_t>;  // (count, tick, slot): lowest goes first

  void touch(uint64_t key);
  void age();
  Rank rank(uint32_t slot) const;
  void make_evictable(uint32_t slot);
  void make_unevictable(uint32_t slot);

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::unordered_map<uint64_t, uint32_t> where_;   // key -> slot
  std::unordered_map<uint64_t, uint32_t> counts_;  // key -> aged use count (resident or not)
  std::set<Rank> evictable_;                       // used, unpinned slots
  uint64_t tick_ = 0, aging_period_ = 0, uses_since_aging_ = 0;
};

}  // namespace moestream
