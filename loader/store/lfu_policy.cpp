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
  auto it = counts_.find(s.key.packed());
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

int LfuPolicy::lookup(ExpertKey key, CacheFill kind) {
  if (kind == CacheFill::kDemand) touch(key.packed());
  const int slot = slot_of(key);
  if (slot < 0)
    stats_.demand_misses += kind == CacheFill::kDemand;
  else
    stats_.count_hit(kind, slots_[size_t(slot)].speculative_unused);
  return slot;
}

int LfuPolicy::slot_of(ExpertKey key) const {
  auto w = where_.find(key.packed());
  return w == where_.end() ? -1 : int(w->second);
}

uint32_t LfuPolicy::count(ExpertKey key) const {
  auto it = counts_.find(key.packed());
  return it == counts_.end() ? 0 : it->second;
}

std::optional<ExpertKey> LfuPolicy::victim(ExpertKey key) const {
  (void)key;  // equal slots: the victim does not depend on the newcomer
  if (!free_.empty() || evictable_.empty()) return std::nullopt;
  return slots_[std::get<2>(*evictable_.begin())].key;
}

bool LfuPolicy::admits(ExpertKey key, CacheFill kind, ExpertKey victim) const {
  return kind != CacheFill::kPrefill && count(victim) <= count(key);
}

CacheAccess LfuPolicy::insert(ExpertKey key, CacheFill kind) {
  MOE_ASSERT(!where_.count(key.packed()), "LfuPolicy::insert of a resident key");
  CacheAccess a;
  uint32_t slot = 0;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    const std::optional<ExpertKey> v = victim(key);
    if (!v || !admits(key, kind, *v)) {
      a.outcome = v && kind == CacheFill::kSpeculative ? CacheOutcome::kDropped : CacheOutcome::kNoRoom;
      stats_.demand_not_admitted += v && kind == CacheFill::kDemand;
    } else {
      auto it = evictable_.begin();
      slot = std::get<2>(*it);
      evictable_.erase(it);
      a.evicted = slots_[slot].key;
      where_.erase(slots_[slot].key.packed());
      ++stats_.evictions;
      a.outcome = CacheOutcome::kFilled;
    }
    if (a.outcome != CacheOutcome::kFilled) {
      stats_.demand_no_room += kind == CacheFill::kDemand;
      stats_.speculative_dropped += a.outcome == CacheOutcome::kDropped;
      stats_.speculative_no_room += kind == CacheFill::kSpeculative && a.outcome == CacheOutcome::kNoRoom;
      stats_.prefill_no_room += kind == CacheFill::kPrefill;
      return a;
    }
  }
  Slot& s = slots_[slot];
  s.key = key;
  s.tick = ++tick_;
  s.used = true;
  s.speculative_unused = kind == CacheFill::kSpeculative;
  where_[key.packed()] = slot;
  make_evictable(slot);
  a.outcome = CacheOutcome::kFilled;
  a.slot = int(slot);
  stats_.speculative_fills += kind == CacheFill::kSpeculative;
  stats_.prefill_fills += kind == CacheFill::kPrefill;
  return a;
}

void LfuPolicy::erase(ExpertKey key) {
  auto w = where_.find(key.packed());
  if (w == where_.end()) return;
  uint32_t slot = w->second;
  make_unevictable(slot);
  where_.erase(w);
  slots_[slot].used = false;
  if (slots_[slot].pins == 0) free_.push_back(slot);
}

void LfuPolicy::pin(int slot) {
  MOE_ASSERT(slot >= 0 && size_t(slot) < slots_.size());
  make_unevictable(uint32_t(slot));
  ++slots_[size_t(slot)].pins;
}

void LfuPolicy::unpin(int slot) {
  MOE_ASSERT(slot >= 0 && size_t(slot) < slots_.size() && slots_[size_t(slot)].pins > 0,
             "unpin of an unpinned slot");
  Slot& s = slots_[size_t(slot)];
  if (--s.pins > 0) return;
  if (s.used)
    make_evictable(uint32_t(slot));
  else
    free_.push_back(uint32_t(slot));  // erased while pinned
}

}  // namespace moestream
