// Implementation of loader/store/foresight_policy.h. Victim search scans the slots (a few thousand
// at most); learning costs n_experts x (1 + guesses) cell updates per layer visit.
#include "loader/store/foresight_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace moestream {

namespace {
// A cell with no data leans on its coarser parent; a trace with none at all starts here (about
// the demo's share of experts reused by the next token).
constexpr double kPriorReuse = 0.3;

int age_cell(int64_t age) {
  if (age <= 1) return 0;
  if (age == 2) return 1;
  if (age <= 4) return 2;
  if (age <= 16) return 3;
  return 4;
}

int heat_cell(double heat) {
  if (heat < 0.25) return 0;
  if (heat < 1) return 1;
  if (heat < 2) return 2;
  if (heat < 4) return 3;
  if (heat < 8) return 4;
  return 5;
}

uint8_t rank_cell(size_t rank) {
  if (rank < 4) return uint8_t(rank);
  return rank < 8 ? 4 : 5;
}
constexpr uint8_t kNotGuessed = ForesightPolicy::kRankCells - 1;
}  // namespace

ForesightPolicy::ForesightPolicy(uint32_t n_slots, int n_layers, int n_experts,
                                 ForesightPolicyOptions options)
    : n_layers_(n_layers), n_experts_(n_experts), options_(options), slots_(n_slots) {
  if (n_slots == 0) throw ConfigError("foresight cache policy: 0 slots");
  if (n_layers <= 0 || n_experts <= 0)
    throw ConfigError("foresight cache policy: " + std::to_string(n_layers) + " layers x " +
                      std::to_string(n_experts) + " experts (both must be > 0)");
  if (!(options.heat_half_life_steps > 0) || !std::isfinite(options.heat_half_life_steps))
    throw ConfigError("foresight cache policy: heat half-life must be a positive number of steps");
  if (!(options.distance_exponent >= 0) || options.distance_exponent > 8)
    throw ConfigError("foresight cache policy: distance exponent must be in [0, 8]");
  const size_t n_keys = size_t(n_layers) * size_t(n_experts);
  if (n_keys > size_t(std::numeric_limits<int>::max()))
    throw ConfigError("foresight cache policy: too many experts");
  for (uint32_t s = n_slots; s-- > 0;) free_.push_back(int(s));
  slot_of_key_.assign(n_keys, -1);
  last_use_.assign(n_keys, -1);
  heat_.assign(n_keys, 0);
  heat_step_.assign(n_keys, 0);
  used_now_.assign(n_keys, 0);
  prior_cell_.assign(n_keys, 0);
  hint_step_.assign(2 * kMaxHintDepth, std::vector<int64_t>(size_t(n_layers), -1));
  hint_rank_.assign(2 * kMaxHintDepth, std::vector<uint8_t>(n_keys, kNotGuessed));
  hinted_.assign(size_t(kMaxHintDepth) * kRankCells * kHistoryCells, Cell{});
  hinted_coarse_.assign(size_t(kMaxHintDepth) * kRankCells, Cell{});
  decay_per_step_ = std::exp2(-1.0 / options.heat_half_life_steps);
}

void ForesightPolicy::set_prior(std::span<const double> use_share) {
  if (use_share.size() != prior_cell_.size())
    throw ConfigError("foresight cache policy: a prior of " + std::to_string(use_share.size()) +
                      " experts for " + std::to_string(n_layers_) + " layers x " +
                      std::to_string(n_experts_) + " experts");
  for (double x : use_share)
    if (!std::isfinite(x) || x < 0)
      throw ConfigError("foresight cache policy: a prior share is negative or not finite");
  // Rank within the layer: the top 1/8 of its experts, the next 1/8, the next 1/4, the rest.
  std::vector<int> order(static_cast<size_t>(n_experts_), 0);
  for (int l = 0; l < n_layers_; ++l) {
    const double* share = use_share.data() + size_t(l) * size_t(n_experts_);
    for (int e = 0; e < n_experts_; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return share[a] > share[b]; });
    for (int r = 0; r < n_experts_; ++r) {
      const int q = 8 * r / n_experts_;  // eighths
      prior_cell_[size_t(l) * size_t(n_experts_) + size_t(order[size_t(r)])] =
          uint8_t(q == 0 ? 0 : q == 1 ? 1 : q <= 3 ? 2 : 3);
    }
  }
}

int ForesightPolicy::key_of(ExpertKey k) const {
  if (k.layer < 0 || k.layer >= n_layers_ || k.expert < 0 || k.expert >= n_experts_)
    throw ConfigError("foresight cache policy: expert (layer " + std::to_string(k.layer) + ", id " +
                      std::to_string(k.expert) + ") outside " + std::to_string(n_layers_) +
                      " layers x " + std::to_string(n_experts_) + " experts");
  return k.layer * n_experts_ + k.expert;
}

int ForesightPolicy::slot_of(ExpertKey key) const { return slot_of_key_[size_t(key_of(key))]; }

double ForesightPolicy::heat_at(int key, int64_t step) const {
  double h = heat_[size_t(key)];
  if (used_now_[size_t(key)]) h = h * std::pow(decay_per_step_, double(visit_step_ - heat_step_[size_t(key)])) + 1,
                              h *= std::pow(decay_per_step_, double(step - visit_step_));
  else h *= std::pow(decay_per_step_, double(step - heat_step_[size_t(key)]));
  return h;
}

int ForesightPolicy::history_cell(int key, int64_t at_step, int64_t last_use) const {
  const int a = last_use < 0 ? kAgeCells - 1 : age_cell(at_step - last_use);
  return (a * kHeatCells + heat_cell(heat_at(key, at_step))) * kPriorCells + prior_cell_[size_t(key)];
}

double ForesightPolicy::probability(int key, int& distance, double* then) const {
  const int l = key / n_experts_;
  // The layer's next visit: later this step, or the next step for layers already visited.
  const bool this_step = l > cur_layer_;
  const int64_t at = this_step ? step_ : step_ + 1;
  distance = this_step ? l - std::max(cur_layer_, -1) : n_layers_ - cur_layer_ + l;
  const int64_t last = used_now_[size_t(key)] ? visit_step_ : last_use_[size_t(key)];
  // A cell with little data leans on its heat's cell over all ages, that one on the mean.
  const double p_all = history_all_.p(kPriorReuse);
  auto p_of = [&](int cell) { return history_[size_t(cell)].p(by_heat_[size_t(cell % (kHeatCells * kPriorCells))].p(p_all)); };
  // Were it not used at that visit: its chance at the one after (history one step older).
  if (then) *then = p_of(history_cell(key, at + 1, last));
  const int h = history_cell(key, at, last);
  const double p_hist = p_of(h);
  for (int j = 0; j < kMaxHintDepth; ++j) {  // the freshest guess: smallest distance first
    const size_t hs = hint_slot(j, at);
    if (hint_step_[hs][size_t(l)] != at) continue;
    const size_t rc = size_t(j) * kRankCells + hint_rank_[hs][size_t(key)];
    return hinted_[rc * kHistoryCells + size_t(h)].p(hinted_coarse_[rc].p(p_hist));
  }
  return p_hist;
}

double ForesightPolicy::value_of(int key) const {
  // Expected uses per slot-layer over the next two visits: a guess that the expert is not wanted
  // this step leaves it its chance at the next one.
  int d = 1;
  double p2 = 0;
  const double p1 = probability(key, d, &p2);
  const double a = options_.distance_exponent;
  return p1 / std::pow(double(std::max(d, 1)), a) +
         (1 - p1) * p2 / std::pow(double(std::max(d, 1) + n_layers_), a);
}

double ForesightPolicy::reuse_probability(ExpertKey key) const {
  int d = 1;
  return probability(key_of(key), d, nullptr);
}

double ForesightPolicy::value(ExpertKey key) const { return value_of(key_of(key)); }

double ForesightPolicy::heat(ExpertKey key) const { return heat_at(key_of(key), step_); }

void ForesightPolicy::finish_visit() {
  if (cur_layer_ < 0 || visit_step_ < 0) return;
  const int l = cur_layer_;
  const int64_t t = visit_step_;
  for (int e = 0; e < n_experts_; ++e) {
    const int key = l * n_experts_ + e;
    // Features as they were before the visit: last use and heat without this visit's use.
    const int a = last_use_[size_t(key)] < 0 ? kAgeCells - 1 : age_cell(t - last_use_[size_t(key)]);
    const double hv = heat_[size_t(key)] * std::pow(decay_per_step_, double(t - heat_step_[size_t(key)]));
    const int h = (a * kHeatCells + heat_cell(hv)) * kPriorCells + prior_cell_[size_t(key)];
    const double y = used_now_[size_t(key)] ? 1 : 0;
    history_[size_t(h)].uses += y, history_[size_t(h)].visits += 1;
    history_all_.uses += y, history_all_.visits += 1;
    Cell& coarse = by_heat_[size_t(h % (kHeatCells * kPriorCells))];
    coarse.uses += y, coarse.visits += 1;
    for (int j = 0; j < kMaxHintDepth; ++j) {
      const size_t hs = hint_slot(j, t);
      if (hint_step_[hs][size_t(l)] != t) continue;
      const size_t rc = size_t(j) * kRankCells + hint_rank_[hs][size_t(key)];
      hinted_coarse_[rc].uses += y, hinted_coarse_[rc].visits += 1;
      hinted_[rc * kHistoryCells + size_t(h)].uses += y, hinted_[rc * kHistoryCells + size_t(h)].visits += 1;
    }
  }
  for (int key : visit_keys_) {
    heat_[size_t(key)] = heat_[size_t(key)] * std::pow(decay_per_step_, double(t - heat_step_[size_t(key)])) + 1;
    heat_step_[size_t(key)] = t;
    last_use_[size_t(key)] = t;
    used_now_[size_t(key)] = 0;
  }
  visit_keys_.clear();
  visit_step_ = -1;
}

void ForesightPolicy::begin_demand(int layer) {
  if (layer == cur_layer_ && visit_step_ == step_) return;
  finish_visit();
  cur_layer_ = layer;
  visit_step_ = step_;
}

void ForesightPolicy::advance_step() {
  finish_visit();
  cur_layer_ = -1;
  ++step_;
}

void ForesightPolicy::hint(int from_layer, int layer, std::span<const int> experts_best_first) {
  if (layer < 0 || layer >= n_layers_ || from_layer < 0 || from_layer >= n_layers_)
    throw ConfigError("foresight cache policy: guess for layer " + std::to_string(layer) +
                      " from layer " + std::to_string(from_layer) + " outside " +
                      std::to_string(n_layers_) + " layers");
  for (int e : experts_best_first)
    if (e < 0 || e >= n_experts_)
      throw ConfigError("foresight cache policy: guessed expert " + std::to_string(e) +
                        " of layer " + std::to_string(layer) + " outside " +
                        std::to_string(n_experts_) + " experts");
  begin_demand(from_layer);  // the engine is at from_layer: its visit has begun
  // The guess is for the layer's next visit: later this step, or the next step's.
  const bool this_step = layer > from_layer;
  const int j = this_step ? layer - from_layer : n_layers_ - from_layer + layer;
  const int64_t target = this_step ? step_ : step_ + 1;
  const size_t hs = hint_slot(std::min(j, kMaxHintDepth) - 1, target);
  auto& ranks = hint_rank_[hs];
  std::fill(ranks.begin() + ptrdiff_t(layer) * n_experts_, ranks.begin() + ptrdiff_t(layer + 1) * n_experts_,
            kNotGuessed);
  for (size_t r = experts_best_first.size(); r-- > 0;)  // a duplicate keeps its best rank
    ranks[size_t(layer) * size_t(n_experts_) + size_t(experts_best_first[r])] = rank_cell(r);
  hint_step_[hs][size_t(layer)] = target;
}

int ForesightPolicy::coldest() const {
  int best = -1;
  double best_value = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.key < 0 || s.pins > 0) continue;
    if (const double v = value_of(s.key); v < best_value) best = int(i), best_value = v;
  }
  return best;
}

std::optional<ExpertKey> ForesightPolicy::victim(ExpertKey key) const {
  key_of(key);
  if (!free_.empty()) return std::nullopt;
  const int v = coldest();
  if (v < 0) return std::nullopt;
  const int k = slots_[size_t(v)].key;
  return ExpertKey{k / n_experts_, k % n_experts_};
}

bool ForesightPolicy::admits(ExpertKey key, CacheFill kind, ExpertKey victim) const {
  const int k = key_of(key), v = key_of(victim);
  MOE_ASSERT(slot_of_key_[size_t(v)] >= 0, "ForesightPolicy::admits: the victim is not resident");
  switch (kind) {
    case CacheFill::kDemand: return !options_.admission || value_of(k) >= value_of(v);
    case CacheFill::kSpeculative: return value_of(k) > value_of(v);
    case CacheFill::kPrefill: return false;
  }
  return false;
}

int ForesightPolicy::lookup(ExpertKey k, CacheFill kind) {
  const int key = key_of(k);
  if (kind == CacheFill::kDemand) {
    begin_demand(k.layer);
    if (!used_now_[size_t(key)]) used_now_[size_t(key)] = 1, visit_keys_.push_back(key);
  }
  const int slot = slot_of_key_[size_t(key)];
  if (slot < 0) {
    stats_.demand_misses += kind == CacheFill::kDemand;
    return -1;
  }
  stats_.count_hit(kind, slots_[size_t(slot)].speculative_unused);
  return slot;
}

CacheAccess ForesightPolicy::insert(ExpertKey k, CacheFill kind) {
  const int key = key_of(k);
  MOE_ASSERT(slot_of_key_[size_t(key)] < 0, "ForesightPolicy::insert of a resident key");
  CacheAccess r;
  int slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
    r.slot_allocated = true;
  } else if (kind != CacheFill::kPrefill) {
    const int v = coldest();
    if (v >= 0) {
      const ExpertKey victim{slots_[size_t(v)].key / n_experts_, slots_[size_t(v)].key % n_experts_};
      if (admits(k, kind, victim)) {
        slot_of_key_[size_t(slots_[size_t(v)].key)] = -1;
        r.evicted = victim;
        ++stats_.evictions;
        slot = v;
      } else if (kind == CacheFill::kSpeculative) {
        r.outcome = CacheOutcome::kDropped;
      } else {
        ++stats_.demand_not_admitted;
      }
    }
  }
  if (slot >= 0) {
    slots_[size_t(slot)] = Slot{key, 0, kind == CacheFill::kSpeculative};
    slot_of_key_[size_t(key)] = slot;
    r.slot = slot;
    r.outcome = CacheOutcome::kFilled;
  }
  stats_.count_insert(kind, r.outcome);
  return r;
}

void ForesightPolicy::pin(int slot) {
  MOE_ASSERT(slot >= 0 && size_t(slot) < slots_.size() && slots_[size_t(slot)].key >= 0,
             "pin of a free slot");
  ++slots_[size_t(slot)].pins;
}

void ForesightPolicy::unpin(int slot) {
  MOE_ASSERT(slot >= 0 && size_t(slot) < slots_.size() && slots_[size_t(slot)].pins > 0,
             "unpin of a slot that is not pinned");
  --slots_[size_t(slot)].pins;
}

}  // namespace moestream
