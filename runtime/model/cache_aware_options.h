// What cache-aware routing is asked to do and what it did: the options and counters the engine's
// public API carries (Model::set_cache_aware, cache_aware_stats). The step itself is
// cache_aware_router.h's.
#pragma once

#include <cstdint>

namespace moestream {

// tolerance: the allowance of substitute_resident (routing.h), on raw router logits.
struct CacheAwareOptions {
  bool enabled = false;
  float tolerance = 0.10f;  // 0 = never substitute (routing identical to cache-aware off)
  // Batches of sequences (--cache-aware-union): an expert an earlier sequence of the same step
  // finally chose counts as resident too (the step reads it once for all). One sequence alone
  // routes exactly as without it (docs/cache_aware.md "Batches: the union rule").
  bool batch_union = false;
};

// Counters over (token, layer) routings since the last reset. Misses count distinct experts of a
// layer's forward chunk that are not resident (one read each), before and after substitution.
struct CacheAwareStats {
  uint64_t routings = 0;        // (token, layer) pairs routed
  uint64_t slots = 0;           // (token, layer, slot) choices: routings * k
  uint64_t slots_unchanged = 0; // choices left as exact top-k chose them
  uint64_t substitutions = 0;   // slots - slots_unchanged
  uint64_t layer_chunks = 0;    // residency snapshots taken (one per layer per forward chunk)
  uint64_t misses_before = 0;   // distinct non-resident experts exact top-k would read
  uint64_t misses_after = 0;    // distinct non-resident experts actually read
  double agreement() const { return slots ? double(slots_unchanged) / double(slots) : 1.0; }
  CacheAwareStats& operator+=(const CacheAwareStats& o);
};

}  // namespace moestream
