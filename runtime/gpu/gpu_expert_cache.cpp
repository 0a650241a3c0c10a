// Implementation of runtime/gpu/gpu_expert_cache.h: the facade over the cache's parts (slot
// memory in gpu_slot_arena, pinned staging and copy batches in gpu_staging_ring, the look-ahead
// thread in gpu_prefetch_worker); GpuExpertCache::Impl (gpu_expert_cache_impl.h) runs the policy.
// This file: construction and teardown, polling, flush, kernel groups and telemetry.
#include "runtime/gpu/gpu_expert_cache.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_expert_cache_impl.h"

namespace moestream {

namespace {

// Pinned staging: at least 64 MiB (a whole Qwen3-30B q4 layer's demand, 8 x 2.6 MB, fits four
// times), at most 1 GiB (Mixtral-size experts), always two of the largest expert.
constexpr size_t kStagingMinBytes = 64 * kGpuCacheMiB;
constexpr size_t kStagingMaxBytes = 1024 * kGpuCacheMiB;

// a += sign * b, field by field (CacheStats is all uint64_t counters).
void add_stats(CacheStats& a, const CacheStats& b, int sign = 1) {
  static_assert(sizeof(CacheStats) % sizeof(uint64_t) == 0);
  constexpr size_t n = sizeof(CacheStats) / sizeof(uint64_t);
  uint64_t va[n], vb[n];
  std::memcpy(va, &a, sizeof a);
  std::memcpy(vb, &b, sizeof b);
  for (size_t i = 0; i < n; ++i) va[i] = sign > 0 ? va[i] + vb[i] : va[i] - vb[i];
  std::memcpy(&a, va, sizeof a);
}

}  // namespace

GpuExpertCache::Impl::Impl(const ModelConfig& c, ExpertStore& s, size_t budget_bytes,
                           gpu::Stream stream, const GpuExpertCacheOptions& o)
    : cfg(c), store(s), budget(budget_bytes), compute(stream), opts(o) {
  try {
    init();
  } catch (...) {
    destroy();
    throw;
  }
}

GpuExpertCache::Impl::~Impl() { destroy(); }

void GpuExpertCache::Impl::init() {
  if (cfg.n_layers <= 0 || cfg.n_experts <= 0)
    throw ConfigError("gpu cache: model has " + std::to_string(cfg.n_layers) + " layers and " +
                      std::to_string(cfg.n_experts) + " experts");
  // A GGUF's expert types may differ from layer to layer: each payload size is a size class of
  // the policy, all drawing on the one budget. Slots are rounded up to kGpuSlotAlign so that every
  // slot of a chunk starts aligned for the kernels (packs' and GGUF's payloads already are).
  for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // MoE layers only (model_config.h)
    layer_bytes.push_back(cfg.expert_layout(l).bytes);
    layer_slot_bytes.push_back(gpu_slot_bytes(layer_bytes.back()));
    layer_parts.push_back(GpuExpertParts::of(cfg.expert_layout(l), size_t(cfg.hidden_size),
                                             size_t(cfg.moe_intermediate_size)));
  }
  const size_t max_bytes = *std::max_element(layer_bytes.begin(), layer_bytes.end());
  const size_t max_slot = *std::max_element(layer_slot_bytes.begin(), layer_slot_bytes.end());
  if (budget < max_slot)
    throw ConfigError("gpu cache: budget of " + std::to_string(budget) +
                      " bytes holds no expert (the largest is " + std::to_string(max_slot) +
                      " bytes); raise " + option_ref("gpu_cache_mb"));
  if (opts.chunk_bytes == 0) throw ConfigError("gpu cache: chunk_bytes must be > 0");
  policy.emplace(budget, cfg.n_experts, layer_slot_bytes);
  std::vector<size_t> class_bytes;
  for (int cls = 0; cls < policy->n_classes(); ++cls) class_bytes.push_back(policy->class_slot_bytes(cls));
  arena.emplace(budget, opts.chunk_bytes, std::move(class_bytes));

  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_free, cudaEventDisableTiming));
  size_t staging_bytes = opts.staging_bytes;
  if (staging_bytes == 0)
    staging_bytes = std::clamp(4 * size_t(std::max(cfg.n_experts_per_tok, 1)) * max_bytes,
                               kStagingMinBytes, kStagingMaxBytes);
  staging_bytes = std::max(staging_bytes, 2 * max_bytes);
  ring.emplace(staging_bytes, copy, events, opts.batch_copies);
  if (opts.pin_page_cache) pinned = std::make_unique<GpuPinnedMappings>(store.mapped_regions());
  if (opts.prefetch_store)
    worker = std::make_unique<GpuPrefetchWorker>(*opts.prefetch_store, max_bytes,
                                                 opts.prefetch_staging_bytes, events,
                                                 [this](Job& j) { release_job(j); });
  arena->reserve_first_chunks();
}

// Never throws: errors here have no one to report to.
void GpuExpertCache::Impl::destroy() noexcept {
  worker.reset();  // stops the thread, waits for its copies
  if (copy) {      // else CUDA was never touched (a ConfigError before any call)
    cudaStreamSynchronize(compute);  // nullptr is the legacy default stream: also waited for
    cudaStreamSynchronize(copy);
  }
  arena.reset();
  slots.clear();
  ring.reset();
  pinned.reset();  // after the copies that read the pages completed
  for (const KernelGroup& g : kernel_groups) cudaEventDestroy(g.done);
  kernel_groups.clear();
  if (scratch_free) cudaEventDestroy(scratch_free);
  scratch_free = nullptr;
  if (copy) cudaStreamDestroy(copy);
  copy = nullptr;
  cudaGetLastError();
}

// Collects finished copies and kernels without blocking: staging and pins are released.
void GpuExpertCache::Impl::poll() {
  if (worker) worker->poll();
  ring->poll();
  while (!kernel_groups.empty() && gpu_event_done(kernel_groups.front().done)) {
    for (int s : kernel_groups.front().slots) policy->unpin(s);
    events.give(kernel_groups.front().done);
    kernel_groups.pop_front();
  }
  arena->free_completed(ring->completed_seq());
}

// Memory for a slot the policy just created.
void GpuExpertCache::Impl::assign_slot(int slot, int cls) {
  arena->assign(slot, cls);
  if (slots.size() <= size_t(slot)) slots.resize(size_t(slot) + 1);
  slots[size_t(slot)] = SlotState{};
}

// The policy gave slot `slot` up (another class needed the bytes); copies issued into it may
// still run, so a chunk it empties is freed after the last batch issued.
void GpuExpertCache::Impl::release_slot(int slot) {
  arena->release(slot, ring->last_seq());
  slots.at(size_t(slot)) = SlotState{};
}

// Under the worker's lock: a prediction no longer holds its slot.
void GpuExpertCache::Impl::release_job(Job& j) {
  policy->unpin(j.slot);
  SlotState& m = slots[size_t(j.slot)];
  if (m.job.get() == &j) m.job.reset();
}

uint8_t* GpuExpertCache::Impl::ensure_scratch(size_t bytes) {
  if (bytes > arena->scratch_bytes() && arena->scratch_bytes() > 0) {
    // Growing: the old area may still be read by kernels or written by copies.
    MOE_CUDA_CHECK(cudaEventSynchronize(scratch_free));
    MOE_CUDA_CHECK(cudaStreamSynchronize(copy));
    poll();
  }
  return arena->scratch(bytes);
}

// VRAM pressure and failed reads: waits for both streams, frees every slot and the scratch
// area and starts the policy afresh (its counters are kept in policy_base).
void GpuExpertCache::Impl::flush() {
  if (worker) worker->drain();
  MOE_CUDA_CHECK(cudaStreamSynchronize(compute));
  MOE_CUDA_CHECK(cudaStreamSynchronize(copy));
  ring->retire_all();
  for (const KernelGroup& g : kernel_groups) events.give(g.done);
  kernel_groups.clear();
  current_pins.clear();
  current_scratch = false;
  scratch_recorded = false;
  arena->release_all();
  slots.clear();
  add_stats(policy_base, policy->stats());
  add_stats(policy_base, policy_offset, -1);
  policy_offset = CacheStats{};
  policy.emplace(budget, cfg.n_experts, layer_slot_bytes);
}

void GpuExpertCache::Impl::close_kernel_group() {
  if (current_pins.empty() && !current_scratch) return;
  KernelGroup g{events.take(), std::move(current_pins)};
  MOE_CUDA_CHECK(cudaEventRecord(g.done, compute));
  kernel_groups.push_back(std::move(g));
  current_pins.clear();
  if (current_scratch) {
    MOE_CUDA_CHECK(cudaEventRecord(scratch_free, compute));
    scratch_recorded = true;
  }
  current_scratch = false;
}

// ---- checks -------------------------------------------------------------------------------
// Between begin_acquire() and finish_acquire() the cache's state belongs to that acquire.
void GpuExpertCache::Impl::require_idle(const char* what) const {
  if (pending.active)
    throw ConfigError(std::string("gpu cache: ") + what +
                      " between begin_acquire and finish_acquire");
}

void GpuExpertCache::Impl::check_layer(int layer, const char* what) const {
  if (layer < 0 || layer >= cfg.n_moe_layers())
    throw ConfigError(std::string("gpu cache: ") + what + " of MoE layer " + std::to_string(layer) +
                      " outside 0.." + std::to_string(cfg.n_moe_layers() - 1));
}

void GpuExpertCache::Impl::require_worker() const {
  if (!worker)
    throw ConfigError("gpu cache: prefetch() needs a prefetch store for its worker thread "
                      "(GpuExpertCacheOptions::prefetch_store, e.g. ExpertStore::reopen())");
}

GpuCacheTelemetry GpuExpertCache::Impl::telemetry() const {
  GpuCacheTelemetry t = tel;
  t.policy = policy_base;
  add_stats(t.policy, policy->stats());
  add_stats(t.policy, policy_offset, -1);
  // A cancelled prediction demanded later counted as a hit (and a used prediction) in the
  // policy, but was read then: a miss.
  t.policy.demand_hits -= refills_demand;
  t.policy.demand_misses += refills_demand;
  t.policy.prefill_hits -= refills_prefill;
  t.policy.prefill_fills += refills_prefill;
  t.policy.speculative_used -= std::min(t.policy.speculative_used, refills_demand + refills_prefill);
  t.prefetch_issued = t.policy.speculative_fills + requeued;
  t.prefetch_used = t.policy.speculative_used;
  t.prefetch_dropped = t.policy.speculative_dropped;
  const GpuPrefetchWorker::Counters w = worker ? worker->counters() : GpuPrefetchWorker::Counters{};
  t.h2d_bytes += w.h2d_bytes;
  t.h2d_copies += w.h2d_copies;
  t.prefetch_h2d_bytes = w.h2d_bytes;
  return t;
}

void GpuExpertCache::Impl::reset_telemetry() {
  tel = GpuCacheTelemetry{};
  refills_demand = refills_prefill = requeued = 0;
  if (worker) worker->reset_counters();
  policy_base = CacheStats{};
  policy_offset = policy->stats();  // the policy's counters only grow
}

// ---- GpuExpertCache ------------------------------------------------------------------------
GpuExpertCache::GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                               gpu::Stream compute)
    : GpuExpertCache(cfg, store, budget_bytes, compute, GpuExpertCacheOptions{}) {}

GpuExpertCache::GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                               gpu::Stream compute, const GpuExpertCacheOptions& opts)
    : impl_(std::make_unique<Impl>(cfg, store, budget_bytes, compute, opts)) {}

GpuExpertCache::~GpuExpertCache() = default;

void GpuExpertCache::acquire(int layer, std::span<const int> ids, CacheFill kind,
                             std::span<const uint8_t*> dev_out) {
  impl_->acquire(layer, ids, kind, dev_out);
}

void GpuExpertCache::acquire_and_prefetch(int layer, std::span<const int> ids, CacheFill kind,
                                          std::span<const uint8_t*> dev_out, int next_layer,
                                          std::span<const int> predicted) {
  impl_->acquire(layer, ids, kind, dev_out, next_layer, predicted);
}

void GpuExpertCache::kernels_enqueued() {
  impl_->require_idle("kernels_enqueued");
  impl_->close_kernel_group();
}

void GpuExpertCache::begin_acquire(int layer, std::span<const int> ids, CacheFill kind,
                                   std::span<const uint8_t*> dev_out, std::span<uint8_t> ready,
                                   int next_layer, std::span<const int> predicted) {
  impl_->begin_acquire(layer, ids, kind, dev_out, ready, next_layer, predicted);
}

void GpuExpertCache::finish_acquire() { impl_->finish_acquire(); }

void GpuExpertCache::prefetch(int layer, std::span<const int> ids) { impl_->prefetch(layer, ids); }

void GpuExpertCache::end_step() {
  impl_->require_idle("end_step");
  impl_->policy->advance_step();
  impl_->poll();
}

GpuCacheTelemetry GpuExpertCache::telemetry() const { return impl_->telemetry(); }

void GpuExpertCache::reset_telemetry() { impl_->reset_telemetry(); }

size_t GpuExpertCache::budget_bytes() const { return impl_->budget; }

size_t GpuExpertCache::expert_bytes(int layer) const {
  impl_->check_layer(layer, "expert_bytes");
  return impl_->layer_bytes[size_t(layer)];
}

const uint8_t* GpuExpertCache::resident_payload(int layer, int expert) const {
  impl_->check_layer(layer, "resident_payload");
  if (expert < 0 || expert >= impl_->cfg.n_experts) return nullptr;
  const int s = impl_->policy->slot_of({layer, expert});
  if (s < 0) return nullptr;
  const Impl::SlotState& m = impl_->slots[size_t(s)];
  if (!m.valid) return nullptr;  // a cancelled prediction: placed, never read
  // A prediction: its bytes are there once its copy completed.
  if (m.job && !impl_->worker->copied(*m.job)) return nullptr;
  return impl_->slot_dev(s);
}

void GpuExpertCache::inject_alloc_failures(int n) { impl_->arena->inject_failures(n); }

uint64_t GpuExpertCache::pinned_bytes() const { return impl_->pinned ? impl_->pinned->bytes() : 0; }
double GpuExpertCache::pinned_seconds() const { return impl_->pinned ? impl_->pinned->seconds() : 0; }

}  // namespace moestream
