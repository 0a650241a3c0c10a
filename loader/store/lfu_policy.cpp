// Implementation of loader/store/lfu_policy.h: an ordered set of (count, last use, slot) finds the
// victim in O(log n); aging halves every count and rebuilds the set (amortised over the period).
#include "loader/store/lfu_policy.h"

#include "common/error.h"

namespace moestream {

LfuPolicy::LfuPolicy(uint32_t n_slots, uint64_t aging_period)
    : slots_(n_slots), aging_period_(aging_period ? aging_period : kDefaultAgingSlots * std::max(1u, n_slots)) {
  free_.reserve(n_slots);
  for (uint32_t s = n_slots; s-- > 0;) free_.push_back(s);  // slot 0 is handed out first
}

LfuPolicy::Rank LfuPolicy::rank(uint32_t slot) const {
  const Slot& s = slots_[slot];
  auto it = counts_.find(s.key);
  return {it == counts_.end() ? 0u : it->second, s.tick, slot};
}

void LfuPolicy::make_evictable(uint32_t slot) {
  if (slots_[slot].used && slots_[slot].pins == 0) evictable_.insert(rank(slot));
}

void LfuPolicy::make_unevictable(uint32_t slot) {
  if (slots_[slot].used && slots_[slot].pins == 0) evictable_.erase(rank(slot));
}

void LfuPolicy::age() {
  evictable_.clear();
  for (auto it = counts_.begin(); it != counts_.end();) {
    it->second /= 2;
    // A key that is neither resident nor used lately is forgotten, bounding the table.
    if (it->second == 0 && !where_.count(it->first))
      it = counts_.erase(it);
    else
      ++it;
  }
  for (uint32_t s = 0; s < slots_.size(); ++s) make_evictable(s);
  uses_since_aging_ = 0;
}

void LfuPolicy::touch(uint64_t key) {
  auto w = where_.find(key);
  if (w != where_.end()) make_unevictable(w->second);
  ++counts_[key];
  ++tick_;
  if (w != where_.end()) {
    slots_[w->second].tick = tick_;
    make_evictable(w->second);
  }
  if (++uses_since_aging_ >= aging_period_) age();
}

std::optional<uint32_t> LfuPolicy::lookup(uint64_t key) {
  touch(key);
  return peek(key);
}

std::optional<uint32_t> LfuPolicy::peek(uint64_t key) const {
  auto w = where_.find(key);
  if (w == where_.end()) return std::nullopt;
  return w->second;
}

uint32_t LfuPolicy::count(uint64_t key) const {
  auto it = counts_.find(key);
  return it == counts_.end() ? 0 : it->second;
}

std::optional<uint32_t> LfuPolicy::insert(uint64_t key, std::optional<uint64_t>* evicted) {
  MOE_ASSERT(!where_.count(key), "LfuPolicy::insert of a resident key");
  if (evicted) evicted->reset();
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (evictable_.empty()) return std::nullopt;
    auto victim = evictable_.begin();
    if (std::get<0>(*victim) > count(key)) return std::nullopt;
    slot = std::get<2>(*victim);
    evictable_.erase(victim);
    if (evicted) *evicted = slots_[slot].key;
    where_.erase(slots_[slot].key);
  }
  Slot& s = slots_[slot];
  s.key = key;
  s.tick = ++tick_;
  s.used = true;
  where_[key] = slot;
  make_evictable(slot);
  return slot;
}

void LfuPolicy::erase(uint64_t key) {
  auto w = where_.find(key);
  if (w == where_.end()) return;
  uint32_t slot = w->second;
  make_unevictable(slot);
  where_.erase(w);
  slots_[slot].used = false;
  if (slots_[slot].pins == 0) free_.push_back(slot);
}

void LfuPolicy::pin(uint32_t slot) {
  MOE_ASSERT(slot < slots_.size());
  make_unevictable(slot);
  ++slots_[slot].pins;
}

void LfuPolicy::unpin(uint32_t slot) {
  MOE_ASSERT(slot < slots_.size() && slots_[slot].pins > 0, "unpin of an unpinned slot");
  if (--slots_[slot].pins > 0) return;
  if (slots_[slot].used)
    make_evictable(slot);
  else
    free_.push_back(slot);  // erased while pinned
}

}  // namespace moestream
