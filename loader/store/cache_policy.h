// One vocabulary for the expert caches of both tiers: what an expert is called (ExpertKey), what a
// fill is (CacheFill), what a placement decided (CacheAccess), and the policy interface that the
// host cache (LfuPolicy) and the GPU cache (LfruPolicy) implement and cluster/cache_sim replays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace moestream {

// An expert as the router names it: layer and logical expert id. Never the slot in the layer
// file (a repack moves that; the store maps logical -> physical only to read).
struct ExpertKey {
  int layer = 0;
  int expert = 0;
  bool operator==(const ExpertKey&) const = default;
  uint64_t packed() const { return uint64_t(uint32_t(layer)) << 32 | uint32_t(expert); }
};

struct ExpertKeyHash {
  size_t operator()(ExpertKey k) const { return std::hash<uint64_t>{}(k.packed()); }
};

// Why an expert is wanted. Only demand heats a key: predictions and prompts say nothing about
// which experts decode keeps using.
enum class CacheFill {
  kDemand,       // needed now by the token being decoded
  kSpeculative,  // predicted for the next layer (look-ahead): may be refused by admission
  kPrefill,      // needed now by a prompt: fills free room only, never evicts
};

enum class CacheOutcome {
  kHit,     // already resident
  kFilled,  // now resident in `slot`: the caller copies the expert there
  kDropped, // speculative fill refused by admission (nothing copied, nothing evicted)
  kNoRoom,  // refused: prefill with no free room, every candidate victim pinned, or a demand
            // miss colder than the victim where the policy admits demand (served uncached)
};

struct CacheAccess {
  CacheOutcome outcome = CacheOutcome::kNoRoom;
  int slot = -1;                    // slot holding the expert for kHit/kFilled
  bool slot_allocated = false;      // the slot is new: the caller allocates its bytes
  std::optional<ExpertKey> evicted; // the resident displaced from `slot`, if any
  std::vector<int> released_slots;  // other slots the caller frees (GPU size classes, rare)
};

// Every field a uint64_t (the GPU cache sums and subtracts them field by field).
struct CacheStats {
  uint64_t demand_hits = 0, demand_misses = 0, demand_no_room = 0;
  uint64_t demand_not_admitted = 0;  // of demand_no_room: refused by admission
  uint64_t speculative_hits = 0, speculative_fills = 0, speculative_dropped = 0;
  uint64_t speculative_used = 0;  // speculatively filled experts later hit by demand
  uint64_t speculative_no_room = 0;
  uint64_t prefill_hits = 0, prefill_fills = 0, prefill_no_room = 0;
  uint64_t evictions = 0, slot_allocs = 0, slot_frees = 0;

  // A lookup of this kind that found its key resident; clears the slot's speculative mark on a
  // demand hit (the guard's "filled speculatively, never used" flag).
  void count_hit(CacheFill kind, bool& speculative_unused) {
    switch (kind) {
      case CacheFill::kDemand:
        ++demand_hits;
        speculative_used += speculative_unused;
        speculative_unused = false;
        break;
      case CacheFill::kSpeculative: ++speculative_hits; break;
      case CacheFill::kPrefill: ++prefill_hits; break;
    }
  }
  // What an insert of this kind decided.
  void count_insert(CacheFill kind, CacheOutcome outcome) {
    switch (kind) {
      case CacheFill::kDemand: demand_no_room += outcome == CacheOutcome::kNoRoom; break;
      case CacheFill::kSpeculative:
        speculative_fills += outcome == CacheOutcome::kFilled;
        speculative_dropped += outcome == CacheOutcome::kDropped;
        speculative_no_room += outcome == CacheOutcome::kNoRoom;
        break;
      case CacheFill::kPrefill:
        prefill_fills += outcome == CacheOutcome::kFilled;
        prefill_no_room += outcome == CacheOutcome::kNoRoom;
        break;
    }
  }
};

// Decides which experts a cache holds; the cache owns the bytes. Slots are small integers the
// policy hands out; -1 is "none". Not thread-safe: one owner drives it.
class CachePolicy {
 public:
  virtual ~CachePolicy() = default;

  // Heat: one use of `key` of this kind (demand heats it, resident or not, so a key that keeps
  // missing earns its place; a demand hit refreshes its recency). The slot holding it, or -1.
  virtual int lookup(ExpertKey key, CacheFill kind) = 0;
  // The slot holding `key` without counting a use (residency queries), or -1.
  virtual int slot_of(ExpertKey key) const = 0;

  // Victim choice: the resident a fill of absent `key` would displace first; nullopt when there
  // is free room or every resident is pinned. Nothing changes.
  virtual std::optional<ExpertKey> victim(ExpertKey key) const = 0;
  // Admission: may a `kind` fill of `key` displace resident `victim`?
  virtual bool admits(ExpertKey key, CacheFill kind, ExpertKey victim) const = 0;
  // Places absent `key` (just missed by lookup()): free room first, else the victims above as
  // admission allows. kFilled with the slot, or the refusal.
  virtual CacheAccess insert(ExpertKey key, CacheFill kind) = 0;
  // lookup(), then insert() on a miss: one access as a fill makes it.
  CacheAccess access(ExpertKey key, CacheFill kind) {
    CacheAccess a;
    if (const int s = lookup(key, kind); s >= 0) {
      a.outcome = CacheOutcome::kHit;
      a.slot = s;
      return a;
    }
    return insert(key, kind);
  }

  // A pinned slot is never a victim (its data is in use). Pins nest.
  virtual void pin(int slot) = 0;
  virtual void unpin(int slot) = 0;

  // One decode step has passed (policies that age by steps use it; others ignore it).
  virtual void advance_step() = 0;
  // What the engine knows of the coming demand: while processing layer `from_layer` (its
  // router's input), its guess of `layer`'s experts at that layer's next visit (later this step
  // for a later layer: the look-ahead; the next step for this or an earlier layer: e.g. its own
  // router's scores ranked), best first. A later guess for the same visit replaces it. Policies
  // that use foresight (ForesightPolicy) override it; the others ignore it.
  virtual void hint(int from_layer, int layer, std::span<const int> experts_best_first) {
    (void)from_layer, (void)layer, (void)experts_best_first;
  }
  // The key's current heat, in uses (a policy's own measure: aged count or decayed frequency).
  virtual double heat(ExpertKey key) const = 0;
  virtual const CacheStats& stats() const = 0;
};

}  // namespace moestream
