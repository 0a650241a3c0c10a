// What the GPU pass reports to the engine's callers: its cache's telemetry, look-ahead, resident
// decode and CPU-miss counters, what it holds (GpuForwardInfo), and why a build or machine cannot
// run it. Plain data (runtime/engine/model.h exposes them); the pass itself is gpu_forward.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loader/store/cache_policy.h"

namespace moestream {

// Why the GPU pass cannot run here, "" when it can: a build without the CUDA tier, or no usable
// CUDA device (the driver's reason). Cheap: callers check it before a slow load.
std::string gpu_unavailable_reason();

struct GpuCacheTelemetry {
  CacheStats policy;                 // from LfruPolicy::stats()
  uint64_t h2d_bytes = 0, h2d_copies = 0;   // copies after merging contiguous slot ranges
  uint64_t h2d_direct_bytes = 0;     // of h2d_bytes, copied straight from page-locked page cache
  uint64_t prefetch_issued = 0;      // predicted experts that were not resident and got a slot
  uint64_t prefetch_used = 0;        // of those, later demanded while still resident
  uint64_t prefetch_dropped = 0;     // refused by the eviction guard
  uint64_t prefetch_ignored = 0;     // ids outside [0, n_experts)
  uint64_t scratch_uses = 0;         // demanded experts that got no slot (went to scratch)
  double demand_wait_s = 0;          // host time blocked reading misses for demand
  uint64_t prefetch_cancelled = 0;   // predictions still unread when their layer's demand
                                     // came without them: never copied
  uint64_t prefetch_refills = 0;     // predictions read by demand after all (a miss): cancelled
                                     // ones demanded later, and ones the worker had not begun
                                     // reading when demanded (taken back from its queue)
  uint64_t prefetch_waits = 0;       // demanded experts whose prefetch the worker had not yet
                                     // copied: the host waited for it to issue the copy
  double prefetch_wait_s = 0;        // host time of those waits
  uint64_t prefetch_h2d_bytes = 0;   // of h2d_bytes, copied by the prefetch worker
  uint64_t alloc_retries = 0;        // device allocations that failed and succeeded after a flush
};

// Look-ahead accuracy, decode only: at layer L+1, how many of the demanded experts (distinct
// top-k ids of the token) were among the `moe_lookahead` experts predicted during layer L.
struct GpuLookaheadStats {
  uint64_t layers = 0;          // layer steps that had a prediction
  uint64_t predicted = 0;       // ids handed to GpuExpertCache::prefetch
  uint64_t demanded = 0;        // demanded experts of those layer steps
  uint64_t demanded_predicted = 0;  // of those, in the prediction
  double recall() const { return demanded > 0 ? double(demanded_predicted) / double(demanded) : 0; }
};

// Decode steps run as one device-side sequence (no host sync per layer; docs/gpu.md "Resident
// decode"): how many were tried, and how many met an expert not resident and were finished
// through the synced path from that layer on.
// Segments of those steps run as CUDA graphs (runtime/gpu/gpu_graphs.h): launched; of them,
// executable graphs updated in place, and instantiated (first use or a change of shape).
struct GpuGraphStats {
  uint64_t launches = 0;
  uint64_t updates = 0;
  uint64_t instantiations = 0;
};
// wall_s: host time inside those steps (table refresh, enqueues, the sync, the cache's bookkeeping
// after it); device_s: the stream's span from an event recorded before the first segment to one
// after lm_head (so it includes any wait for the host's next segment). wall_s less device_s is
// host work outside that span; the decode's seconds less wall_s is the work between steps
// (embedding, sampling, the caller).
struct GpuResidentStats {
  uint64_t steps = 0;
  uint64_t redone = 0;
  GpuGraphStats graphs;
  double wall_s = 0;
  double device_s = 0;
};

// --gpu-cpu-misses: decode experts computed on the CPU, and the layer steps that had any.
struct GpuCpuMissStats {
  uint64_t experts = 0;
  uint64_t layers = 0;
};
struct GpuForwardStats {
  GpuCacheTelemetry cache;
  GpuLookaheadStats lookahead;
  GpuResidentStats resident;
  GpuCpuMissStats cpu_misses;
};
// a - b field by field (counters since a snapshot); used for the decode share of a run.
GpuForwardStats operator-(const GpuForwardStats& a, const GpuForwardStats& b);

// What the GPU backend holds, for the startup line and --stats-json.
struct GpuForwardInfo {
  std::string device;            // e.g. "NVIDIA H200"
  size_t dense_bytes = 0;        // dense weights on the device, matrices as stored
  size_t kv_bytes = 0;           // KV cache
  size_t scratch_bytes = 0;      // activations
  size_t expert_bytes_total = 0; // all experts of the model, as stored
  size_t free_bytes_before_cache = 0;
  size_t cache_bytes = 0;        // GPU expert cache budget in effect
  std::string cache_rule;        // how the budget was chosen
  int moe_lookahead = 0;
  uint64_t preload_experts = 0;  // --gpu-preload: experts read into the cache before the first token
  size_t preload_bytes = 0;
  double preload_s = 0;
  uint64_t pinned_bytes = 0;     // --gpu-pin-page-cache: the model's files page-locked
  double pinned_s = 0;
  std::string describe() const;  // one line
};

}  // namespace moestream
