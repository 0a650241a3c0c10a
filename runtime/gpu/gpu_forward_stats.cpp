// The GPU forward pass's counters and description (runtime/gpu/gpu_forward.h) as plain C++:
// compiled in every build, so the runtime's stats code needs no CUDA.
#include <cstdio>
#include <string>

#include "runtime/gpu/gpu_forward.h"

namespace moestream {

namespace {

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

}  // namespace

GpuForwardStats operator-(const GpuForwardStats& a, const GpuForwardStats& b) {
  GpuForwardStats d;
  const CacheStats &p = a.cache.policy, &q = b.cache.policy;
  CacheStats& r = d.cache.policy;
  r.demand_hits = p.demand_hits - q.demand_hits;
  r.demand_misses = p.demand_misses - q.demand_misses;
  r.demand_no_room = p.demand_no_room - q.demand_no_room;
  r.demand_not_admitted = p.demand_not_admitted - q.demand_not_admitted;
  r.speculative_hits = p.speculative_hits - q.speculative_hits;
  r.speculative_fills = p.speculative_fills - q.speculative_fills;
  r.speculative_dropped = p.speculative_dropped - q.speculative_dropped;
  r.speculative_used = p.speculative_used - q.speculative_used;
  r.speculative_no_room = p.speculative_no_room - q.speculative_no_room;
  r.prefill_hits = p.prefill_hits - q.prefill_hits;
  r.prefill_fills = p.prefill_fills - q.prefill_fills;
  r.prefill_no_room = p.prefill_no_room - q.prefill_no_room;
  r.evictions = p.evictions - q.evictions;
  r.slot_allocs = p.slot_allocs - q.slot_allocs;
  r.slot_frees = p.slot_frees - q.slot_frees;
  d.cache.h2d_bytes = a.cache.h2d_bytes - b.cache.h2d_bytes;
  d.cache.h2d_direct_bytes = a.cache.h2d_direct_bytes - b.cache.h2d_direct_bytes;
  d.cache.h2d_copies = a.cache.h2d_copies - b.cache.h2d_copies;
  d.cache.prefetch_issued = a.cache.prefetch_issued - b.cache.prefetch_issued;
  d.cache.prefetch_used = a.cache.prefetch_used - b.cache.prefetch_used;
  d.cache.prefetch_dropped = a.cache.prefetch_dropped - b.cache.prefetch_dropped;
  d.cache.prefetch_ignored = a.cache.prefetch_ignored - b.cache.prefetch_ignored;
  d.cache.scratch_uses = a.cache.scratch_uses - b.cache.scratch_uses;
  d.cache.demand_wait_s = a.cache.demand_wait_s - b.cache.demand_wait_s;
  d.cache.alloc_retries = a.cache.alloc_retries - b.cache.alloc_retries;
  d.cache.prefetch_cancelled = a.cache.prefetch_cancelled - b.cache.prefetch_cancelled;
  d.cache.prefetch_refills = a.cache.prefetch_refills - b.cache.prefetch_refills;
  d.cache.prefetch_waits = a.cache.prefetch_waits - b.cache.prefetch_waits;
  d.cache.prefetch_wait_s = a.cache.prefetch_wait_s - b.cache.prefetch_wait_s;
  d.cache.prefetch_h2d_bytes = a.cache.prefetch_h2d_bytes - b.cache.prefetch_h2d_bytes;
  d.lookahead.layers = a.lookahead.layers - b.lookahead.layers;
  d.lookahead.predicted = a.lookahead.predicted - b.lookahead.predicted;
  d.lookahead.demanded = a.lookahead.demanded - b.lookahead.demanded;
  d.lookahead.demanded_predicted = a.lookahead.demanded_predicted - b.lookahead.demanded_predicted;
  d.resident.steps = a.resident.steps - b.resident.steps;
  d.resident.redone = a.resident.redone - b.resident.redone;
  d.resident.wall_s = a.resident.wall_s - b.resident.wall_s;
  d.resident.device_s = a.resident.device_s - b.resident.device_s;
  d.resident.graphs.launches = a.resident.graphs.launches - b.resident.graphs.launches;
  d.resident.graphs.updates = a.resident.graphs.updates - b.resident.graphs.updates;
  d.resident.graphs.instantiations = a.resident.graphs.instantiations - b.resident.graphs.instantiations;
  d.cpu_misses.experts = a.cpu_misses.experts - b.cpu_misses.experts;
  d.cpu_misses.layers = a.cpu_misses.layers - b.cpu_misses.layers;
  return d;
}

std::string GpuForwardInfo::describe() const {
  std::string s = device + ": dense weights " + mib(dense_bytes) + ", KV cache " + mib(kv_bytes) +
                  ", activations " + mib(scratch_bytes) + "; expert cache " + mib(cache_bytes) +
                  " (" + cache_rule + ")";
  s += moe_lookahead > 0 ? ", look-ahead " + std::to_string(moe_lookahead) + " experts"
                         : ", no look-ahead";
  if (preload_experts > 0)
    s += "; preloaded " + std::to_string(preload_experts) + " experts (" + mib(preload_bytes) +
         ") in " + std::to_string(int(preload_s * 1000 + 0.5)) + " ms";
  if (pinned_bytes > 0)
    s += "; page cache pinned: " + mib(pinned_bytes) + " in " + std::to_string(int(pinned_s * 1000 + 0.5)) + " ms";
  return s;
}

}  // namespace moestream
