// Implementation of loader/store/lfru_policy.h. Victim search is a linear scan over the live
// slots: a few thousand at most (48 layers x 128 experts), cheap next to one expert copy.
#include "loader/store/lfru_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace moestream {

namespace {
constexpr uint64_t kUnit = uint64_t{1} << LfruPolicy::kHeatFracBits;
// 2^24 units: 40 bits of heat above the 8-bit recency byte, and heat * decay_ (< 2^24) fits 64.
constexpr uint64_t kHeatMax = (uint64_t{1} << (24 + LfruPolicy::kHeatFracBits)) - 1;
constexpr int kDecayBits = 24;  // scale of decay_
constexpr uint32_t kHalfLifeMax = 1u << 20;  // decay_ holds one entry per step of a half-life
}  // namespace

LfruPolicy::LfruPolicy(size_t budget_bytes, int n_experts, std::vector<size_t> layer_expert_bytes,
                       LfruPolicyOptions options)
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

int LfruPolicy::key_of(ExpertKey k) const {
  if (k.layer < 0 || size_t(k.layer) >= layer_class_.size() || k.expert < 0 || k.expert >= n_experts_)
    throw ConfigError("gpu cache: expert (layer " + std::to_string(k.layer) + ", id " +
                      std::to_string(k.expert) + ") outside " + std::to_string(layer_class_.size()) +
                      " layers x " + std::to_string(n_experts_) + " experts");
  return k.layer * n_experts_ + k.expert;
}

int LfruPolicy::class_of_layer(int layer) const { return layer_class_.at(size_t(layer)); }

int LfruPolicy::slot_of(ExpertKey key) const { return slot_of_key_[size_t(key_of(key))]; }

uint64_t LfruPolicy::decayed(int key) const {
  const uint64_t h = heat_[size_t(key)];
  const uint64_t h_steps = options_.heat_half_life_steps;
  if (h_steps == 0 || h == 0) return h;
  const uint64_t age = step_ - heat_step_[size_t(key)];
  const uint64_t halvings = age / h_steps;
  if (halvings >= 64) return 0;
  return ((h >> halvings) * decay_[size_t(age % h_steps)]) >> kDecayBits;
}

uint64_t LfruPolicy::heat_fixed(ExpertKey key) const { return decayed(key_of(key)); }

double LfruPolicy::heat(ExpertKey key) const {
  return std::ldexp(double(heat_fixed(key)), -kHeatFracBits);
}

uint32_t LfruPolicy::demand_accesses(ExpertKey key) const {
  return demand_count_[size_t(key_of(key))];
}

uint64_t LfruPolicy::score(int slot) const {
  const Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live && s.key >= 0, "score of an empty slot");
  const uint64_t age = std::min<uint64_t>(step_ - s.last_step, 255);
  return (decayed(s.key) << 8) | (255 - age);
}

int LfruPolicy::class_slots(int cls) const {
  int n = 0;
  for (const Slot& s : slots_) n += s.live && s.cls == cls;
  return n;
}

void LfruPolicy::pin(int slot) {
  Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live, "pin of a free slot");
  ++s.pins;
}

void LfruPolicy::unpin(int slot) {
  Slot& s = slots_.at(size_t(slot));
  MOE_ASSERT(s.live && s.pins > 0, "unpin of a slot that is not pinned");
  --s.pins;
}

bool LfruPolicy::guarded(int victim_key, uint64_t prediction_heat) const {
  // heat_v > 1.25 * heat_p + 4 units, in integers: 4 * heat_v > 5 * heat_p + 16 units.
  if (demand_count_[size_t(victim_key)] < 2) return false;
  return 4 * decayed(victim_key) > 5 * prediction_heat + 16 * kUnit;
}

bool LfruPolicy::admits_slot(int key, CacheFill kind, int victim_slot) const {
  const uint64_t heat = decayed(key);
  switch (kind) {
    case CacheFill::kSpeculative: return !guarded(slots_[size_t(victim_slot)].key, heat);
    case CacheFill::kDemand:
      // The newcomer, were it resident, would score (heat, touched now); colder than the
      // victim, it would be the next victim itself, so it gets no slot.
      return !options_.demand_admission || ((heat << 8) | 255) >= score(victim_slot);
    case CacheFill::kPrefill: return false;
  }
  return false;
}

bool LfruPolicy::admits(ExpertKey key, CacheFill kind, ExpertKey victim) const {
  const int v = slot_of_key_[size_t(key_of(victim))];
  MOE_ASSERT(v >= 0, "LfruPolicy::admits: the victim is not resident");
  return admits_slot(key_of(key), kind, v);
}

std::optional<ExpertKey> LfruPolicy::victim(ExpertKey key) const {
  const int cls = layer_class_[size_t(key_of(key) / n_experts_)];
  if (bytes_allocated_ + class_bytes_[size_t(cls)] <= budget_bytes_) return std::nullopt;
  int v = coldest(cls, true);
  if (v < 0) v = coldest(cls, false);
  if (v < 0) return std::nullopt;
  return expert_key(slots_[size_t(v)].key);
}

int LfruPolicy::coldest(int cls, bool same_class) const {
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

int LfruPolicy::new_slot(int cls) {
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

void LfruPolicy::free_slot(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.key >= 0) slot_of_key_[size_t(s.key)] = -1;
  bytes_allocated_ -= class_bytes_[size_t(s.cls)];
  s = Slot{};
  dead_slots_.push_back(slot);
  ++stats_.slot_frees;
}

CacheOutcome LfruPolicy::place(int cls, int key, CacheFill kind, CacheAccess& r) {
  const size_t need = class_bytes_[size_t(cls)];
  // 1. Unused budget: a new slot, no eviction (the only path prefill may take).
  if (bytes_allocated_ + need <= budget_bytes_) {
    r.slot = new_slot(cls);
    r.slot_allocated = true;
    return CacheOutcome::kFilled;
  }
  if (kind == CacheFill::kPrefill) return CacheOutcome::kNoRoom;
  // A refusal: the guard drops a prediction, admission serves a demand miss from scratch.
  auto refuse = [&] {
    if (kind == CacheFill::kSpeculative) return CacheOutcome::kDropped;
    ++stats_.demand_not_admitted;
    return CacheOutcome::kNoRoom;
  };
  // 2. The coldest unpinned slot of the class itself: reused in place, no free/alloc.
  if (int v = coldest(cls, true); v >= 0) {
    Slot& s = slots_[size_t(v)];
    if (!admits_slot(key, kind, v)) return refuse();
    r.evicted = expert_key(s.key);
    slot_of_key_[size_t(s.key)] = -1;
    s.key = -1;
    s.speculative_unused = false;
    ++stats_.evictions;
    r.slot = v;
    return CacheOutcome::kFilled;
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
    if (best < 0) return CacheOutcome::kNoRoom;
    if (!admits_slot(key, kind, best)) return refuse();
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
  return CacheOutcome::kFilled;
}

int LfruPolicy::lookup(ExpertKey k, CacheFill kind) {
  const int key = key_of(k);
  if (kind == CacheFill::kDemand) {
    heat_[size_t(key)] = std::min(decayed(key) + kUnit, kHeatMax);
    heat_step_[size_t(key)] = step_;
    demand_count_[size_t(key)] += demand_count_[size_t(key)] != UINT32_MAX;
  }
  const int slot = slot_of_key_[size_t(key)];
  if (slot < 0) {
    stats_.demand_misses += kind == CacheFill::kDemand;
    return -1;
  }
  Slot& s = slots_[size_t(slot)];
  if (kind == CacheFill::kDemand) s.last_step = step_;
  stats_.count_hit(kind, s.speculative_unused);
  return slot;
}

CacheAccess LfruPolicy::insert(ExpertKey k, CacheFill kind) {
  const int key = key_of(k);
  MOE_ASSERT(slot_of_key_[size_t(key)] < 0, "LfruPolicy::insert of a resident key");
  CacheAccess r;
  r.outcome = place(layer_class_[size_t(k.layer)], key, kind, r);
  if (r.outcome == CacheOutcome::kFilled) {
    Slot& s = slots_[size_t(r.slot)];
    s.key = key;
    s.last_step = step_;
    s.speculative_unused = kind == CacheFill::kSpeculative;
    slot_of_key_[size_t(key)] = r.slot;
  }
  stats_.count_insert(kind, r.outcome);
  return r;
}

}  // namespace moestream
