// Internal to runtime/gpu: GpuExpertCache::Impl, the state that ties the cache's parts together
// and the one place that calls LfruPolicy. Its lifecycle, flush and telemetry are in
// gpu_expert_cache.cpp; the acquire and prefetch paths in gpu_expert_cache_acquire.cpp.
//
// Ordering rests on two in-order streams:
// - Copy batches are numbered (seq) on the copy stream (GpuStagingRing), so "batch N done"
//   implies every earlier batch done: one completed_seq answers whether a slot's bytes, or a
//   staging range, are free.
// - Kernel groups (one per acquire, closed by kernels_enqueued) complete in order on `compute`;
//   their slots stay pinned in the policy until the group's event has completed.
// - Predictions go to the GpuPrefetchWorker with its own store, staging and copy stream. This
//   thread alone touches the policy and slot memory: it places and pins a predicted slot, the
//   worker only reads and copies into it; the slot is unpinned once the job's copy completed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "runtime/gpu/gpu_prefetch_worker.h"
#include "runtime/gpu/gpu_slot_arena.h"
#include "runtime/gpu/gpu_host_pin.h"
#include "runtime/gpu/gpu_staging_ring.h"

namespace moestream {

struct GpuExpertCache::Impl {
  using Job = GpuPrefetchWorker::Job;
  using JobPtr = GpuPrefetchWorker::JobPtr;
  using JobState = GpuPrefetchWorker::JobState;
  struct SlotState {        // by policy slot index, beside the arena's memory
    uint64_t fill_seq = 0;  // copy batch that last wrote the slot (0: none)
    JobPtr job;             // the prediction filling it, until its copy has completed
    bool valid = true;      // false: a cancelled prediction, its bytes never written
  };
  struct KernelGroup {      // the kernels of one acquire()
    cudaEvent_t done;
    std::vector<int> slots;
  };
  // Between begin_acquire() and finish_acquire(): what is still to be read and waited for.
  struct Pending {
    bool active = false;
    int layer = 0;
    CacheFill kind = CacheFill::kDemand;
    std::vector<int> miss_ids;
    std::vector<GpuCopy> cs;
    std::vector<JobPtr> predicted;  // hits whose prediction is queued or in flight
    uint64_t refills = 0;
  };

  ModelConfig cfg;
  ExpertStore& store;
  size_t budget;
  cudaStream_t compute;
  cudaStream_t copy = nullptr;
  GpuExpertCacheOptions opts;
  std::vector<size_t> layer_bytes;       // payload bytes of one expert, by layer
  std::vector<size_t> layer_slot_bytes;  // its slot: gpu_slot_bytes(payload), the policy's class
  std::vector<GpuExpertParts> layer_parts;  // where its matrices go in the slot, by layer
  std::unique_ptr<GpuPinnedMappings> pinned;  // opts.pin_page_cache: the store's mappings, locked
  std::optional<LfruPolicy> policy;
  CacheStats policy_base;    // policy stats from before the last flush, since the last reset
  CacheStats policy_offset;  // the live policy's stats at the last reset_telemetry()
  GpuCacheTelemetry tel;
  uint64_t refills_demand = 0, refills_prefill = 0, requeued = 0;  // telemetry corrections

  GpuEventPool events;  // declared first: the parts below give their events back to it
  std::optional<GpuSlotArena> arena;
  std::optional<GpuStagingRing> ring;
  std::unique_ptr<GpuPrefetchWorker> worker;  // with opts.prefetch_store only
  std::vector<SlotState> slots;

  Pending pending;
  std::vector<int> current_pins;  // slots of the last acquire(), kernels not yet enqueued
  bool current_scratch = false;
  std::deque<KernelGroup> kernel_groups;
  cudaEvent_t scratch_free = nullptr;  // recorded after the kernels that last read scratch
  bool scratch_recorded = false;

  // ---- gpu_expert_cache.cpp: lifecycle, memory, flush, telemetry ----------------------------
  Impl(const ModelConfig& c, ExpertStore& s, size_t budget_bytes, gpu::Stream stream,
       const GpuExpertCacheOptions& o);
  ~Impl();
  void init();
  void destroy() noexcept;  // errors here have no one to report to
  // Collects finished copies and kernels without blocking: staging and pins are released.
  void poll();
  uint8_t* slot_dev(int slot) const { return arena->slot_ptr(slot); }
  // The staging copy of `bytes` into `slot`'s device memory.
  GpuCopy slot_copy(int slot, size_t bytes) const {
    return GpuCopy{slot_dev(slot), nullptr, bytes, slot, 0, arena->slot_region(slot)};
  }
  void assign_slot(int slot, int cls);   // memory for a slot the policy just created
  void release_slot(int slot);           // the policy gave the slot up
  void release_job(Job& j);              // under the worker's lock: j no longer holds its slot
  uint8_t* ensure_scratch(size_t bytes);
  // VRAM pressure and failed reads: waits for both streams, frees every slot and the scratch
  // area and starts the policy afresh (its counters are kept in policy_base).
  void flush();
  void close_kernel_group();
  void require_idle(const char* what) const;
  void check_layer(int layer, const char* what) const;
  void require_worker() const;
  GpuCacheTelemetry telemetry() const;
  void reset_telemetry();

  // Runs `op` (see GpuSlotArena::with_vram_retry): a failed device allocation flushes the
  // cache and retries once.
  template <class Op>
  void with_vram_retry(Op&& op) {
    arena->with_vram_retry(op, [&] { flush(); }, tel.alloc_retries);
  }

  // A placement (kFilled) whose bytes could not be read leaves garbage in a slot the policy
  // thinks resident: the cache is flushed before the error goes up.
  template <class Op>
  void flush_on_error(Op&& op) {
    try {
      op();
    } catch (...) {
      try {
        flush();
      } catch (const std::exception&) {
        // A device fault during the flush: the original error is the one to report.
      }
      throw;
    }
  }

  // ---- gpu_expert_cache_acquire.cpp: the acquire and prefetch paths -------------------------
  void begin_acquire(int layer, std::span<const int> ids, CacheFill kind,
                     std::span<const uint8_t*> dev_out, std::span<uint8_t> ready,
                     int pf_layer = -1, std::span<const int> pf_ids = {});
  void finish_acquire();
  void acquire(int layer, std::span<const int> ids, CacheFill kind, std::span<const uint8_t*> dev_out,
               int pf_layer = -1, std::span<const int> pf_ids = {});
  void prefetch(int layer, std::span<const int> ids);
  void check_worker_error();
  void await_prediction(const JobPtr& j);
  void cancel_unasked(int layer, const std::vector<int>& asked);
  std::vector<int> prediction_ids(std::span<const int> ids);
  void place_predictions(int layer, const std::vector<int>& uniq,
                         std::vector<std::pair<int, int>>& placed, uint64_t& again);
  void queue_predictions(int layer, const std::vector<std::pair<int, int>>& placed);
};

}  // namespace moestream
