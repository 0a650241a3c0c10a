// Implementation of loader/store/gpu_cache_policy.h. Victim search is a linear scan over the live
// slots: a few thousand at most (48 layers x 128 experts), cheap next to one expert copy.
#include "loader/store/gpu_cache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace moestream {

namespace {
constexpr uint64_t kUnit = uint64_t{1} << GpuCachePolicy::kHeatFracBits;
// 2^24 units: 40 bits of heat above the 8-bit recency byte, and heat * decay_ (< 2^24) fits 64.
constexpr uint64_t kHeatMax = (uint64_t{1} << (24 + GpuCachePolicy::kHeatFracBits)) - 1;
constexpr int kDecayBits = 24;  // scale of decay_
constexpr uint32_t kHalfLifeMax = 1u << 20;  // decay_ holds one entry per step of a half-life
}  // namespace

GpuCachePolicy::GpuCachePolicy(size_t budget_bytes, int n_experts,
                               std::vector<size_t> layer_expert_bytes, GpuCachePolicyOptions options)
    : budget_bytes_(budget_bytes), n_experts_(n_experts), options_(options) {
  if (n_experts <= 0) throw ConfigError("gpu cache: n_experts must be > 0, got " + std::to_string(n_experts));
  const uint32_t h = options.heat_half_life_steps;
  if (h > kHalfLifeMax)
    throw ConfigError("gpu cache: heat half-life " + std::to_string(h) + " steps is above " +
                      std::to_string(kHalfLifeMax) + " (0 disables decay)");
  // decay_[a] = 2^(-a/H) in 2^-24 units for a < H; whole half-lives are shifts.
  for (uint32_t a = 0; a < h; ++a)
    decay_.push_back(uint64_t(std::llround(std::ldexp(std::exp2(-double(a) / double(h)), kDecayBits))));
  if (layer_expert_bytes.empty()) throw ConfigError("gpu cache: no layers");
  for (size_t l = 0; l < layer_expert_bytes.size(); ++l) {
    const size_t b = layer_expert_bytes[l];
    if (b == 0) throw ConfigError("gpu cache: layer " + std::to_string(l) + " has 0-byte experts");
    auto it = std::find(class_bytes_.begin(), class_bytes_.end(), b);
    if (it == class_bytes_.end()) {
      class_bytes_.push_back(b);
      it = class_bytes_.end() - 1;
    }
    layer_class_.push_back(int(it - class_bytes_.begin()));
  }
  const size_t n_keys = layer_expert_bytes.size() * size_t(n_experts);
  slot_of_key_.assign(n_keys, -1);
  heat_.assign(n_keys, 0);
  heat_step_.assign(n_keys, 0);
  demand_count_.assign(n_keys, 0);
}

int GpuCachePolicy::key_of(int layer, int expert) const {
  if (layer < 0 || size_t(layer) >= layer_class_.size() || expert < 0 || expert >= n_experts_)
    throw ConfigError("gpu cache: expert (layer " + std::to_string(layer) + ", id " +
                      std::to_string(expert) + ") outside " + std::to_string(layer_class_.size()) +
                      " layers x " + std::to_string(n_experts_) + " experts");
  return layer * n_experts_ + expert;
}

int GpuCachePolicy::class_of_layer(int layer) const { return layer_class_.at(size_t(layer)); }

int GpuCachePolicy::slot_of(int layer, int expert) const {
  return slot_of_key_[size_t(key_of(layer, expert))];
}

uint64_t GpuCachePolicy::decayed(int key) const {
  const uint64_t h = heat_[size_t(key)];
  const uint64_t h_steps = options_.heat_half_life_steps;
  if (h_steps == 0 || h == 0) return h;
  const uint64_t age = step_ - heat_step_[size_t(key)];
  const uint64_t halvings = age / h_steps;
  if (halvings >= 64) return 0;
  return ((h >> halvings) * decay_[size_t(age % h_steps)]) >> kDecayBits;
}

uint64_t GpuCachePolicy::heat_fixed(int layer, int expert) const { return decayed(key_of(layer, expert)); }

double GpuCachePolicy::heat(int layer, int expert) const {
  return std::ldexp(double(heat_fixed(layer, expert)), -kHeatFracBits);
}

uint32_t GpuCachePolicy::demand_accesses(int layer, int expert) const {
  return demand_count_[size_t(key_of(layer, expert))];
}

uint64_t GpuCachePolicy::score(int slot) const {
  const Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live && s.key >= 0, "score of an empty slot");
  const uint64_t age = std::min<uint64_t>(step_ - s.last_step, 255);
  return (decayed(s.key) << 8) | (255 - age);
}

int GpuCachePolicy::class_slots(int cls) const {
  int n = 0;
  for (const Slot& s : slots_) n += s.live && s.cls == cls;
  return n;
}

void GpuCachePolicy::pin(int slot) {
  Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live, "pin of a free slot");
  ++s.pins;
}

void GpuCachePolicy::unpin(int slot) {
  Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live && s.pins > 0, "unpin of a slot that is not pinned");
  --s.pins;
}

bool GpuCachePolicy::guarded(int victim_key, uint64_t prediction_heat) const {
  // heat_v > 1.25 * heat_p + 4 units, in integers: 4 * heat_v > 5 * heat_p + 16 units.
  if (demand_count_[size_t(victim_key)] < 2) return false;
  return 4 * decayed(victim_key) > 5 * prediction_heat + 16 * kUnit;
}

int GpuCachePolicy::coldest(int cls, bool same_class) const {
  int best = -1;
  uint64_t best_score = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.live || s.pins > 0 || (s.cls == cls) != same_class) continue;
    const uint64_t sc = score(int(i));
    if (sc < best_score) best = int(i), best_score = sc;
  }
  return best;
}

int GpuCachePolicy::new_slot(int cls) {
  int idx;
  if (!dead_slots_.empty()) {
    idx = dead_slots_.back();
    dead_slots_.pop_back();
  } else {
    idx = int(slots_.size());
    slots_.emplace_back();
  }
  slots_[size_t(idx)] = Slot{cls, -1, 0, step_, true, false};
  bytes_allocated_ += class_bytes_[size_t(cls)];
  ++stats_.slot_allocs;
  return idx;
}

void GpuCachePolicy::free_slot(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.key >= 0) slot_of_key_[size_t(s.key)] = -1;
  bytes_allocated_ -= class_bytes_[size_t(s.cls)];
  s = Slot{};
  dead_slots_.push_back(slot);
  ++stats_.slot_frees;
}

GpuCacheOutcome GpuCachePolicy::place(int cls, int key, GpuFill kind, GpuCacheResult& r) {
  const size_t need = class_bytes_[size_t(cls)];
  // 1. Unused budget: a new slot, no eviction (the only path prefill may take).
  if (bytes_allocated_ + need <= budget_bytes_) {
    r.slot = new_slot(cls);
    r.slot_allocated = true;
    return GpuCacheOutcome::kFilled;
  }
  if (kind == GpuFill::kPrefill) return GpuCacheOutcome::kNoRoom;
  const uint64_t pred_heat = decayed(key);
  // Admission: the newcomer, were it resident, would score (heat, touched now); colder than the
  // coldest candidate, it would be the next victim, so it gets no slot.
  const uint64_t new_score = (pred_heat << 8) | 255;
  const bool admit_check = kind == GpuFill::kDemand && options_.demand_admission;
  // 2. The coldest unpinned slot of the class itself: reused in place, no free/alloc.
  if (int v = coldest(cls, true); v >= 0) {
    Slot& s = slots_[size_t(v)];
    if (kind == GpuFill::kSpeculative && guarded(s.key, pred_heat)) return GpuCacheOutcome::kDropped;
    if (admit_check && new_score < score(v)) {
      ++stats_.demand_not_admitted;
      return GpuCacheOutcome::kNoRoom;
    }
    r.evicted_layer = s.key / n_experts_;
    r.evicted_expert = s.key % n_experts_;
    slot_of_key_[size_t(s.key)] = -1;
    s.key = -1;
    s.speculative_unused = false;
    ++stats_.evictions;
    r.slot = v;
    return GpuCacheOutcome::kFilled;
  }
  // 3. The class owns no evictable slot: take other classes' coldest slots until the bytes fit.
  //    Chosen first, freed only if enough are found and none is guarded, so a refusal changes nothing.
  std::vector<int> victims;
  size_t freed = 0;
  std::vector<uint8_t> taken(slots_.size(), 0);
  while (bytes_allocated_ - freed + need > budget_bytes_) {
    int best = -1;
    uint64_t best_score = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (!s.live || s.pins > 0 || s.cls == cls || taken[i]) continue;
      if (const uint64_t sc = score(int(i)); sc < best_score) best = int(i), best_score = sc;
    }
    if (best < 0) return GpuCacheOutcome::kNoRoom;
    if (kind == GpuFill::kSpeculative && guarded(slots_[size_t(best)].key, pred_heat))
      return GpuCacheOutcome::kDropped;
    if (admit_check && new_score < best_score) {
      ++stats_.demand_not_admitted;
      return GpuCacheOutcome::kNoRoom;
    }
    taken[size_t(best)] = 1;
    victims.push_back(best);
    freed += class_bytes_[size_t(slots_[size_t(best)].cls)];
  }
  for (int v : victims) {
    stats_.evictions += slots_[size_t(v)].key >= 0;
    free_slot(v);
    r.released_slots.push_back(v);
  }
  r.slot = new_slot(cls);
  r.slot_allocated = true;
  return GpuCacheOutcome::kFilled;
}

GpuCacheResult GpuCachePolicy::access(int layer, int expert, GpuFill kind) {
  const int key = key_of(layer, expert);
  GpuCacheResult r;
  if (kind == GpuFill::kDemand) {
    heat_[size_t(key)] = std::min(decayed(key) + kUnit, kHeatMax);
    heat_step_[size_t(key)] = step_;
    demand_count_[size_t(key)] += demand_count_[size_t(key)] != UINT32_MAX;
  }
  if (const int slot = slot_of_key_[size_t(key)]; slot >= 0) {
    Slot& s = slots_[size_t(slot)];
    r.outcome = GpuCacheOutcome::kHit;
    r.slot = slot;
    switch (kind) {
      case GpuFill::kDemand:
        ++stats_.demand_hits;
        s.last_step = step_;
        if (s.speculative_unused) ++stats_.speculative_used;
        s.speculative_unused = false;
        break;
      case GpuFill::kSpeculative: ++stats_.speculative_hits; break;
      case GpuFill::kPrefill: ++stats_.prefill_hits; break;
    }
    return r;
  }
  if (kind == GpuFill::kDemand) ++stats_.demand_misses;
  r.outcome = place(layer_class_[size_t(layer)], key, kind, r);
  if (r.outcome == GpuCacheOutcome::kFilled) {
    Slot& s = slots_[size_t(r.slot)];
    s.key = key;
    s.last_step = step_;
    s.speculative_unused = kind == GpuFill::kSpeculative;
    slot_of_key_[size_t(key)] = r.slot;
  }
  switch (kind) {
    case GpuFill::kDemand:
      stats_.demand_no_room += r.outcome == GpuCacheOutcome::kNoRoom;
      break;
    case GpuFill::kSpeculative:
      stats_.speculative_fills += r.outcome == GpuCacheOutcome::kFilled;
      stats_.speculative_dropped += r.outcome == GpuCacheOutcome::kDropped;
      stats_.speculative_no_room += r.outcome == GpuCacheOutcome::kNoRoom;
      break;
    case GpuFill::kPrefill:
      stats_.prefill_fills += r.outcome == GpuCacheOutcome::kFilled;
      stats_.prefill_no_room += r.outcome == GpuCacheOutcome::kNoRoom;
      break;
  }
  return r;
}

}  // namespace moestream
