// A cache policy that uses what the engine knows of the future (issue 23): the look-ahead's
// guesses of the coming layers' experts (CachePolicy::hint) and each expert's reuse history, turned
// into a probability of use at its layer's next visit by tables it learns online; the resident
// least worth its slot (that probability over the layers until the visit) is the victim.
//
// Model (decode visits the layers 0..n_layers-1 in turn, one step per token):
// - At a decision during layer L of step t, a resident of layer l > L is next wanted d = l - L
//   layers from now (this step); one of layer l <= L is wanted d = n_layers - L + l layers from now
//   (the next step). Value = p / d^distance_exponent; the lowest value is the victim.
// - p: learned online, per feature cell, as (uses + 4 p_coarse) / (visits + 4) (coarse: the same
//   heat over all ages for a history cell, the guess's cell over all histories). History cell =
//   steps since the expert's last use (1, 2, 3-4, 5-16, more/never) x its decayed demand heat
//   (half-life heat_half_life_steps; < 0.25, 1, 2, 4, 8, more). Where the look-ahead guessed the
//   layer this step, the cell is also keyed by the distance j (layers between the guess and its
//   target, 1..kMaxHintDepth, the freshest guess wins) and the expert's rank in the guess (0, 1,
//   2, 3, 4-7, 8+, not guessed). Every visit of a layer teaches the tables every expert of it
//   (used or not), with its features as they were before the visit.
// - Admission (option, on by default): with no free slot, a demand miss whose value (as a
//   resident just used) is below the victim's gets no slot (kNoRoom: served uncached, as the GPU
//   cache serves from scratch); a speculative fill needs a value above the victim's (kDropped).
//   Prefill fills free slots only.
// - Pinned slots are never victims. Keys: layer < n_layers, expert < n_experts (ConfigError).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "loader/store/cache_policy.h"

namespace moestream {

struct ForesightPolicyOptions {
  // Heat half-life in steps (the history cell's frequency). Tuned on traces other than the
  // reported ones (docs/results.md, issue 23).
  double heat_half_life_steps = 16;
  // Value = p / d^exponent: 1 = expected uses per slot-layer held (the reuse rate), 0 = p alone.
  // 0.5: within 0.1 point of the best of 0..3 on the tuning traces at every capacity.
  double distance_exponent = 0.5;
  bool admission = true;
};

class ForesightPolicy final : public CachePolicy {
 public:
  static constexpr int kMaxHintDepth = 8;  // guesses further ahead than this are ignored
  static constexpr int kAgeCells = 5, kHeatCells = 6, kRankCells = 7, kPriorCells = 4;
  static constexpr int kHistoryCells = kAgeCells * kHeatCells * kPriorCells;

  ForesightPolicy(uint32_t n_slots, int n_layers, int n_experts, ForesightPolicyOptions options = {});

  int lookup(ExpertKey key, CacheFill kind) override;
  int slot_of(ExpertKey key) const override;
  std::optional<ExpertKey> victim(ExpertKey key) const override;
  bool admits(ExpertKey key, CacheFill kind, ExpertKey victim) const override;
  CacheAccess insert(ExpertKey key, CacheFill kind) override;
  void pin(int slot) override;
  void unpin(int slot) override;
  void advance_step() override;
  // Remembers the guess; a `from_layer` other than the layer being visited starts its visit.
  void hint(int from_layer, int layer, std::span<const int> experts_best_first) override;
  double heat(ExpertKey key) const override;
  const CacheStats& stats() const override { return stats_; }

  // Priors learned from other traces: each expert's share of its layer's demand, by key (layer *
  // n_experts + expert). Its rank in its layer (top 1/8, next 1/8, next 1/4, rest) becomes one
  // more feature of the history cell. ConfigError on a wrong size or a negative/NaN share.
  void set_prior(std::span<const double> use_share);
  // The learned probability that `key` is used at its layer's next visit, and its value (above).
  double reuse_probability(ExpertKey key) const;
  double value(ExpertKey key) const;
  uint32_t n_slots() const { return uint32_t(slots_.size()); }

 private:
  struct Slot {
    int key = -1;  // layer * n_experts + expert; -1 free
    uint32_t pins = 0;
    bool speculative_unused = false;
  };
  struct Cell {
    double uses = 0, visits = 0;
    double p(double coarse) const { return (uses + 4 * coarse) / (visits + 4); }
  };

  int key_of(ExpertKey k) const;
  double heat_at(int key, int64_t step) const;
  int history_cell(int key, int64_t at_step, int64_t last_use) const;
  double probability(int key, int& distance, double* then) const;
  double value_of(int key) const;
  int coldest() const;  // unpinned slot of lowest value, -1 when none
  void begin_demand(int layer);
  void finish_visit();  // teaches the tables the visit of cur_layer_ at visit_step_

  int n_layers_, n_experts_;
  ForesightPolicyOptions options_;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  std::vector<int> slot_of_key_;
  std::vector<int64_t> last_use_;     // by key: step of the last demand use, -1 never
  std::vector<double> heat_;          // by key: heat as of heat_step_
  std::vector<int64_t> heat_step_;
  std::vector<uint8_t> used_now_;     // by key: demanded in the visit in progress
  std::vector<uint8_t> prior_cell_;   // by key: its rank cell in the prior (0 without one)
  std::vector<int> visit_keys_;       // keys demanded in the visit in progress
  // Guesses: per distance j-1 and parity of the target step (a guess of the next step must not
  // replace one of this step before this step's visit taught the tables), the step each layer's
  // guess is for and each key's rank cell.
  std::vector<std::vector<int64_t>> hint_step_;
  std::vector<std::vector<uint8_t>> hint_rank_;
  size_t hint_slot(int j, int64_t target) const { return size_t(j) * 2 + size_t(target & 1); }
  std::array<Cell, kHistoryCells> history_{};
  std::array<Cell, kHeatCells * kPriorCells> by_heat_{};
  Cell history_all_;
  std::vector<Cell> hinted_;        // [(j-1) * kRankCells + rank] * kHistoryCells + history
  std::vector<Cell> hinted_coarse_; // (j-1) * kRankCells + rank
  int cur_layer_ = -1;
  int64_t visit_step_ = -1;
  int64_t step_ = 0;
  double decay_per_step_ = 1;
  CacheStats stats_;
};

}  // namespace moestream
