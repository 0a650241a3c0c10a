// Which experts live in VRAM: the GPU expert cache's policy (loader/store/cache_policy.h) as plain
// C++ (no CUDA), so CI tests it. Slot pools per expert size class under one byte budget, LFRU
// victims, and the eviction guard.
//
// Rules (issue 8):
// - A layer's experts all have one payload size; layers of equal size share a size class, whose
//   slots hold exactly that many bytes. Classes draw slots from one shared byte budget. A slot,
//   once allocated, stays in its class and is reused by evictions within the class, so layers
//   that alternate classes cause no free/alloc churn; a class frees another class's slots only
//   when it owns no evictable slot at all (its first fill after another class took the budget).
// - Victim = the unpinned resident of lowest LFRU score: demand heat in the high bits, recency in
//   the low byte (255 for a slot touched this step, one less per step since, saturating at 0).
// - Heat is a decaying frequency of demand accesses: each access adds one unit, and heat halves
//   every `heat_half_life_steps` decode steps (smoothly: x 2^(-1/H) per step), so experts whose
//   popularity has passed cool down instead of holding their slots forever (0: no decay, LFU).
//   Fixed point: heat_fixed = units << kHeatFracBits, saturating at 2^24 units; the score is
//   heat_fixed << 8 | recency.
// - Heat counts demand accesses only (kept for non-resident experts too: a prediction has one).
//   Prefill touches do not heat: a long prompt would make every expert look warm.
// - Demand, speculative and prefill fills go through one eviction core. A speculative fill may
//   displace a resident only when the resident is not genuinely warm: a resident with >= 2 raw
//   demand accesses (counted, not decayed) whose heat exceeds the prediction's by 25% + 4 units
//   (heat_v > 1.25 * heat_p + 4) stays, and the prediction is dropped (counted), never forced in.
//   Prefill fills free budget only.
// - Demand admission (option, off by default): with no free budget, a demand miss whose score is
//   below every victim candidate's gets no slot (kNoRoom, served from scratch by the GPU cache), so
//   a one-off expert does not evict a warm one.
// - Keys are (layer, logical expert id); layers of the constructor's list, ids below n_experts
//   (ConfigError otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "loader/store/cache_policy.h"

namespace moestream {

struct LfruPolicyOptions {
  // Heat half-life in decode steps; 0: heat never decays. 16: the best compromise on demo-model
  // traces other than the reported ones (decode traces peak at 16-32, a bursty perplexity trace
  // at 8-16; docs/results.md, issue 8 section). The eviction guard needs H >~ 8 to still see
  // an expert demanded on 6 consecutive steps as warm.
  uint32_t heat_half_life_steps = 16;
  // Off by default: +2.8 to +5.8 points at 5-10% capacity on decode traces, -2 on a bursty one.
  bool demand_admission = false;
};

class LfruPolicy final : public CachePolicy {
 public:
  static constexpr int kHeatFracBits = 16;  // heat_fixed units per demand access: 1 << 16

  // layer_expert_bytes[l]: payload bytes of one expert of layer l (ExpertLayout::bytes).
  LfruPolicy(size_t budget_bytes, int n_experts, std::vector<size_t> layer_expert_bytes,
             LfruPolicyOptions options = {});

  int lookup(ExpertKey key, CacheFill kind) override;
  int slot_of(ExpertKey key) const override;
  // The coldest unpinned slot of the key's size class, else of the other classes.
  std::optional<ExpertKey> victim(ExpertKey key) const override;
  // Speculative: the eviction guard; demand: score admission when the option is on; prefill: never.
  bool admits(ExpertKey key, CacheFill kind, ExpertKey victim) const override;
  // Places absent `key` under the rules above. Refusals: kDropped (speculative fill guarded
  // against), kNoRoom (everything else); a refusal changes nothing.
  CacheAccess insert(ExpertKey key, CacheFill kind) override;
  // A running kernel reads the slot: it is never chosen as a victim until unpinned.
  void pin(int slot) override;
  void unpin(int slot) override;
  // One decode step has passed: recency of every resident ages by one.
  void advance_step() override { ++step_; }
  double heat(ExpertKey key) const override;  // heat_fixed in units (1 = one fresh access)
  const CacheStats& stats() const override { return stats_; }

  uint64_t heat_fixed(ExpertKey key) const;       // decayed to the current step
  uint32_t demand_accesses(ExpertKey key) const;  // raw count, never decays
  const LfruPolicyOptions& options() const { return options_; }
  uint64_t score(int slot) const;            // LFRU score of an occupied slot
  int n_classes() const { return int(class_bytes_.size()); }
  int class_of_layer(int layer) const;
  size_t class_slot_bytes(int cls) const { return class_bytes_.at(size_t(cls)); }
  int class_slots(int cls) const;            // live slots of the class
  size_t bytes_allocated() const { return bytes_allocated_; }
  size_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Slot {
    int cls = -1;
    int key = -1;  // layer * n_experts + expert
    uint32_t pins = 0;
    uint64_t last_step = 0;
    bool live = false;
    bool speculative_unused = false;  // filled by a prediction, not yet demanded
  };

  int key_of(ExpertKey k) const;
  ExpertKey expert_key(int key) const { return ExpertKey{key / n_experts_, key % n_experts_}; }
  uint64_t decayed(int key) const;  // heat_fixed of key at step_
  bool guarded(int victim_key, uint64_t prediction_heat) const;
  bool admits_slot(int key, CacheFill kind, int victim_slot) const;
  int coldest(int cls_filter, bool same_class) const;  // -1 when none unpinned
  int new_slot(int cls);
  void free_slot(int slot);
  // The eviction core shared by every fill kind: a slot of class `cls` for `key`, or an outcome.
  CacheOutcome place(int cls, int key, CacheFill kind, CacheAccess& r);

  size_t budget_bytes_;
  int n_experts_;
  std::vector<int> layer_class_;     // by layer
  std::vector<size_t> class_bytes_;  // by class
  std::vector<Slot> slots_;
  std::vector<int> dead_slots_;      // indices of freed Slot entries, reused
  std::vector<int> slot_of_key_;     // by key, -1 when not resident
  LfruPolicyOptions options_;
  std::vector<uint64_t> decay_;      // by age % H: 2^(-age/H) scaled by 2^24
  std::vector<uint64_t> heat_;       // by key: heat_fixed as of step heat_step_[key]
  std::vector<uint64_t> heat_step_;
  std::vector<uint32_t> demand_count_;  // by key: raw demand accesses, saturating
  size_t bytes_allocated_ = 0;
  uint64_t step_ = 0;
  CacheStats stats_;
};

}  // namespace moestream
