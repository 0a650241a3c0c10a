// The GPU expert cache: VRAM slots holding expert payloads, placed by LfruPolicy, filled from
// an ExpertStore through pinned staging on a copy stream. Plain C++ (no CUDA include).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kernels/cuda/gpu_ops.h"
#include "loader/store/expert_store.h"
#include "loader/store/lfru_policy.h"
#include "runtime/gpu/gpu_stats.h"
#include "loader/format/model_config.h"

namespace moestream {

// Tuning knobs beyond the budget; the defaults suit the engine, tests shrink them.
struct GpuExpertCacheOptions {
  // Device memory per cudaMalloc of slots: few calls (each may synchronize the device) and at
  // most one chunk reserved beyond what the policy uses.
  size_t chunk_bytes = size_t{64} << 20;
  size_t staging_bytes = 0;   // pinned staging ring; 0: 4 x top-k experts, in [64 MiB, 1 GiB]
  bool batch_copies = true;   // cudaMemcpyBatchAsync for several ranges where the runtime has it
  // The prefetch worker's own store (ExpertStore::reopen() of `store`: a store is not
  // thread-safe); prefetch() is a ConfigError without one. Not owned; outlives the cache.
  ExpertStore* prefetch_store = nullptr;
  size_t prefetch_staging_bytes = 0;  // the worker's pinned staging; 0: 64 MiB, >= 2 experts
  // Page-lock the store's file mappings (ExpertStore::mapped_regions, gpu_host_pin.h) so misses
  // computed in place are copied from the page cache with no host copy; ConfigError when they
  // cannot be (O_DIRECT, too little memory, the device or CUDA refuses).
  bool pin_page_cache = false;
};

class GpuExpertCache {
 public:
  // Installs a slot pool for every expert size class at construction (so a prefetch can never
  // silently no-op), pinned host staging, a copy stream and events. A size class is one payload
  // size (cfg.expert_layout(l).bytes, rounded up to 16 bytes): layers of a GGUF whose expert
  // types differ get pools of different sizes, all under the one byte budget. budget_bytes must
  // fit at least one expert of the largest class: ConfigError otherwise.
  GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                 gpu::Stream compute);
  GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                 gpu::Stream compute, const GpuExpertCacheOptions& opts);
  ~GpuExpertCache();
  GpuExpertCache(const GpuExpertCache&) = delete;
  GpuExpertCache& operator=(const GpuExpertCache&) = delete;

  // Makes experts `ids` of `layer` available on the device; dev_out[i] = device pointer to the
  // payload of ids[i] (loader/format/expert_file.h layout). kind: kDemand (decode) or kPrefill (may fill
  // free budget, never evicts). Misses are read through store.begin_fetch/next_ready (host tiers
  // first), staged in pinned memory, copied on the copy stream (contiguous slot ranges in one
  // copy; cudaMemcpyBatchAsync where the runtime has it) as soon as they land (each
  // next_ready(), plus any others ready by then, is one copy batch), and `compute` is made to wait
  // (cudaStreamWaitEvent) for exactly those copies; nothing missing -> no wait. Experts that get
  // no slot go to a scratch area valid until the kernels of this call finished.
  void acquire(int layer, std::span<const int> ids, CacheFill kind,
               std::span<const uint8_t*> dev_out);
  // acquire() that also queues prefetch(next_layer, predicted) after placing its own experts
  // (pinned first, so no prediction can evict what this call is about to use) and before
  // reading its misses (the worker reads the predictions while this thread reads the demand).
  void acquire_and_prefetch(int layer, std::span<const int> ids, CacheFill kind,
                            std::span<const uint8_t*> dev_out, int next_layer,
                            std::span<const int> predicted);
  // acquire() in two halves, so kernels on resident experts run while the misses are read:
  // begin_acquire() places every expert (and queues the predictions, if next_layer >= 0) as
  // acquire() does, fills dev_out for all, and sets ready[i] = 1 where `compute` may read
  // dev_out[i] already (resident hits; a hit whose copy is still in flight gets a compute wait
  // here), 0 where the bytes are still to come (misses, scratch, predictions not yet copied).
  // finish_acquire() then reads those, copies each group of experts as soon as it has landed,
  // and makes `compute` wait for them. Nothing else may be called on the cache in between
  // (ConfigError); acquire() is begin_acquire() + finish_acquire().
  void begin_acquire(int layer, std::span<const int> ids, CacheFill kind,
                     std::span<const uint8_t*> dev_out, std::span<uint8_t> ready,
                     int next_layer = -1, std::span<const int> predicted = {});
  void finish_acquire();
  // Call right after enqueuing the kernels that read the experts of the last acquire(): records
  // an event on `compute`; those slots stay pinned (never victims) until it has completed.
  // A new acquire() without it does the same first (the previous kernels are enqueued by then).
  void kernels_enqueued();
  // Look-ahead, returns at once: the policy places predicted experts of `layer` under the
  // eviction guard (ids outside [0, n_experts) ignored, counted), each placed slot is pinned and
  // its read queued to a worker thread, which reads through opts.prefetch_store, stages in its
  // own pinned memory and copies on its own copy stream (a demand copy never queues behind a
  // prediction), recording an event per expert. Never synchronizes a stream, never makes
  // `compute` wait. A later acquire() of a predicted expert does not read it twice: one the
  // worker has not begun reading is taken back and read by the acquire; otherwise it waits
  // (host) until the worker has issued its copy, then makes `compute` wait for that event;
  // acquire() of a layer cancels the layer's predictions it does not ask for that are not yet
  // being copied. A worker read error is thrown (after a flush) by the next call.
  void prefetch(int layer, std::span<const int> ids);
  // One decode step done: ages recency (LfruPolicy::advance_step).
  void end_step();
  GpuCacheTelemetry telemetry() const;
  void reset_telemetry();
  size_t budget_bytes() const;

  // Payload bytes of one expert of `layer` (ModelConfig::expert_layout: a GGUF's differ by layer).
  size_t expert_bytes(int layer) const;
  // Device pointer of (layer, expert) when resident with its bytes in place, else nullptr (a
  // prediction whose copy has not completed or that was cancelled counts as absent; tests).
  const uint8_t* resident_payload(int layer, int expert) const;
  // opts.pin_page_cache: bytes of the store's files page-locked, and the seconds it took (0, 0 without).
  uint64_t pinned_bytes() const;
  double pinned_seconds() const;

  // Test hook: the next `n` device allocations of expert memory fail as if cudaMalloc returned
  // cudaErrorMemoryAllocation, to exercise the flush-and-retry path without filling VRAM.
  void inject_alloc_failures(int n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
