// Implementation of runtime/gpu/gpu_expert_cache.h: slot chunks per size class, the pinned staging
// ring, the copy stream and the events that order copies, kernels and staging reuse.
//
// Ordering rests on two in-order streams:
// - Copy batches are numbered (seq) on the copy stream, so "batch N done" implies every earlier
//   batch done: one completed_seq answers whether a slot's bytes, or a staging range, are free.
// - Kernel groups (one per acquire, closed by kernels_enqueued) complete in order on `compute`;
//   their slots stay pinned in the policy until the group's event has completed.
#include "runtime/gpu/gpu_expert_cache.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cuda_check.cuh"

namespace moestream {

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// Pinned staging: at least 64 MiB (a whole Qwen3-30B q4 layer's demand, 8 x 2.6 MB, fits four
// times), at most 1 GiB (Mixtral-size experts), always two of the largest expert.
constexpr size_t kStagingMinBytes = 64 * kMiB;
constexpr size_t kStagingMaxBytes = 1024 * kMiB;

struct DeviceOom {
  size_t bytes;
};

// a += sign * b, field by field (GpuCacheStats is all uint64_t counters).
void add_stats(GpuCacheStats& a, const GpuCacheStats& b, int sign = 1) {
  static_assert(sizeof(GpuCacheStats) % sizeof(uint64_t) == 0);
  constexpr size_t n = sizeof(GpuCacheStats) / sizeof(uint64_t);
  uint64_t va[n], vb[n];
  std::memcpy(va, &a, sizeof a);
  std::memcpy(vb, &b, sizeof b);
  for (size_t i = 0; i < n; ++i) va[i] = sign > 0 ? va[i] + vb[i] : va[i] - vb[i];
  std::memcpy(&a, va, sizeof a);
}

std::string mib(size_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

}  // namespace

struct GpuExpertCache::Impl {
  struct Chunk {
    uint8_t* dev = nullptr;    // nullptr: entry unused (freed), reusable
    std::vector<uint8_t> used; // by position
    int n_used = 0;
  };
  struct SlotMem {             // by policy slot index
    int cls = -1, chunk = -1, pos = -1;
    uint8_t* dev = nullptr;
    uint64_t fill_seq = 0;     // copy batch that last wrote the slot (0: none)
  };
  struct Batch {               // one group of copies on the copy stream
    uint64_t seq;
    cudaEvent_t done;
    size_t stage_begin, stage_end;  // staging bytes the copies read
  };
  struct KernelGroup {         // the kernels of one acquire()
    cudaEvent_t done;
    std::vector<int> slots;
  };
  struct Copy {                // one expert to bring to the device
    uint8_t* dst;
    const uint8_t* src;        // the store's payload
    size_t bytes;
    int slot;                  // policy slot, -1 for scratch
  };

  ModelConfig cfg;
  ExpertStore& store;
  size_t budget;
  cudaStream_t compute;
  cudaStream_t copy = nullptr;
  GpuExpertCacheOptions opts;
  std::vector<size_t> layer_bytes;
  std::optional<GpuCachePolicy> policy;
  GpuCacheStats policy_base;   // policy stats from before the last flush, since the last reset
  GpuCacheStats policy_offset; // the live policy's stats at the last reset_telemetry()
  GpuCacheTelemetry tel;

  std::vector<std::vector<Chunk>> pools;  // by class
  std::vector<SlotMem> slot_mem;
  size_t reserved_bytes = 0;              // bytes of live chunks
  std::vector<std::pair<uint64_t, uint8_t*>> free_later;  // chunk freed once batch seq is done

  uint8_t* staging = nullptr;
  size_t staging_bytes = 0, staging_head = 0;
  uint64_t next_seq = 0, completed_seq = 0;
  std::deque<Batch> batches;

  std::vector<int> current_pins;   // slots of the last acquire(), kernels not yet enqueued
  bool current_scratch = false;
  std::deque<KernelGroup> kernel_groups;
  uint8_t* scratch = nullptr;
  size_t scratch_bytes = 0;
  cudaEvent_t scratch_free = nullptr;  // recorded after the kernels that last read scratch
  bool scratch_recorded = false;
  std::vector<cudaEvent_t> spare_events;
  int inject_failures = 0;

  Impl(const ModelConfig& c, ExpertStore& s, size_t budget_bytes, gpu::Stream stream,
       const GpuExpertCacheOptions& o)
      : cfg(c), store(s), budget(budget_bytes), compute(stream), opts(o) {
    try {
      init();
    } catch (...) {
      destroy();
      throw;
    }
  }

  void init() {
    if (cfg.n_layers <= 0 || cfg.n_experts <= 0)
      throw ConfigError("gpu cache: model has " + std::to_string(cfg.n_layers) + " layers and " +
                        std::to_string(cfg.n_experts) + " experts");
    const size_t bytes =
        ExpertLayout::make(cfg.expert_quant, size_t(cfg.hidden_size), size_t(cfg.moe_intermediate_size)).bytes;
    layer_bytes.assign(size_t(cfg.n_layers), bytes);
    const size_t max_bytes = *std::max_element(layer_bytes.begin(), layer_bytes.end());
    if (budget < max_bytes)
      throw ConfigError("gpu cache: budget of " + std::to_string(budget) +
                        " bytes holds no expert (one expert is " + std::to_string(max_bytes) +
                        " bytes); raise --gpu-cache-mb");
    if (opts.chunk_bytes == 0) throw ConfigError("gpu cache: chunk_bytes must be > 0");
    policy.emplace(budget, cfg.n_experts, layer_bytes);
    pools.resize(size_t(policy->n_classes()));

    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_free, cudaEventDisableTiming));
    staging_bytes = opts.staging_bytes;
    if (staging_bytes == 0)
      staging_bytes = std::clamp(4 * size_t(std::max(cfg.n_experts_per_tok, 1)) * max_bytes,
                                 kStagingMinBytes, kStagingMaxBytes);
    staging_bytes = std::max(staging_bytes, 2 * max_bytes);
    if (cudaError_t e = cudaMallocHost(&staging, staging_bytes); e != cudaSuccess) {
      cudaGetLastError();
      throw Error("gpu cache: cannot allocate " + mib(staging_bytes) + " of pinned host staging: " +
                  cudaGetErrorString(e));
    }
    // Every class's pool exists from the start, with its first chunk, so the first prediction
    // of a class finds memory as readily as its first demand.
    const size_t share = budget / pools.size();
    for (int cls = 0; cls < int(pools.size()); ++cls) {
      const size_t b = policy->class_slot_bytes(cls);
      const int n = int(std::clamp<size_t>(std::min(opts.chunk_bytes, share) / b, 1,
                                            std::max<size_t>(budget / b, 1)));
      try {
        add_chunk(cls, n);
      } catch (const DeviceOom& oom) {
        release_all_memory();
        throw Error("gpu cache: cannot allocate the first " + mib(oom.bytes) +
                    " of device memory for expert slots (" + memory_report() + ")");
      }
    }
  }

  ~Impl() { destroy(); }

  // Never throws: errors here have no one to report to.
  void destroy() noexcept {
    if (copy) {  // else CUDA was never touched (a ConfigError before any call)
      cudaStreamSynchronize(compute);  // nullptr is the legacy default stream: also waited for
      cudaStreamSynchronize(copy);
    }
    release_all_memory();
    for (const Batch& b : batches) cudaEventDestroy(b.done);
    for (const KernelGroup& g : kernel_groups) cudaEventDestroy(g.done);
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
    if (scratch_free) cudaEventDestroy(scratch_free);
    batches.clear();
    kernel_groups.clear();
    spare_events.clear();
    scratch_free = nullptr;
    if (staging) cudaFreeHost(staging);
    staging = nullptr;
    if (copy) cudaStreamDestroy(copy);
    copy = nullptr;
    cudaGetLastError();
  }

  std::string memory_report() const {
    size_t free_b = 0, total_b = 0;
    std::string s = "budget " + mib(budget);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      s += ", device has " + mib(free_b) + " free of " + mib(total_b);
    else
      cudaGetLastError();
    return s;
  }

  // ---- events -------------------------------------------------------------------------------
  cudaEvent_t take_event() {
    if (!spare_events.empty()) {
      cudaEvent_t e = spare_events.back();
      spare_events.pop_back();
      return e;
    }
    cudaEvent_t e;
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // True when the event completed; false while pending; throws on a device fault.
  static bool done(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    MOE_CUDA_CHECK(r);
    return false;
  }

  void retire_front_batch() {
    Batch& b = batches.front();
    completed_seq = b.seq;
    spare_events.push_back(b.done);
    batches.pop_front();
  }

  // Collects finished copies and kernels without blocking: staging and pins are released.
  void poll() {
    while (!batches.empty() && done(batches.front().done)) retire_front_batch();
    while (!kernel_groups.empty() && done(kernel_groups.front().done)) {
      for (int s : kernel_groups.front().slots) policy->unpin(s);
      spare_events.push_back(kernel_groups.front().done);
      kernel_groups.pop_front();
    }
    std::erase_if(free_later, [&](const std::pair<uint64_t, uint8_t*>& f) {
      if (f.first > completed_seq) return false;
      cudaFree(f.second);
      return true;
    });
  }

  // Blocks the host until copy batch `seq` is done (staging reuse only).
  void wait_batch(uint64_t seq) {
    while (completed_seq < seq) {
      MOE_ASSERT(!batches.empty(), "waiting for a copy batch that was never issued");
      MOE_CUDA_CHECK(cudaEventSynchronize(batches.front().done));
      retire_front_batch();
    }
  }

  cudaEvent_t batch_event(uint64_t seq) const {
    MOE_ASSERT(!batches.empty() && seq >= batches.front().seq && seq <= batches.back().seq,
               "copy batch not in flight");
    return batches[size_t(seq - batches.front().seq)].done;
  }

  // ---- device memory ------------------------------------------------------------------------
  uint8_t* device_alloc(size_t bytes) {
    if (inject_failures > 0) {
      --inject_failures;
      throw DeviceOom{bytes};
    }
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so later calls do not report it
      throw DeviceOom{bytes};
    }
    MOE_CUDA_CHECK(e);
    return static_cast<uint8_t*>(p);
  }

  int add_chunk(int cls, int n_slots) {
    const size_t b = policy->class_slot_bytes(cls);
    uint8_t* dev = device_alloc(size_t(n_slots) * b);
    std::vector<Chunk>& pool = pools[size_t(cls)];
    auto it = std::find_if(pool.begin(), pool.end(), [](const Chunk& c) { return !c.dev; });
    if (it == pool.end()) it = pool.insert(pool.end(), Chunk{});
    it->dev = dev;
    it->used.assign(size_t(n_slots), 0);
    it->n_used = 0;
    reserved_bytes += size_t(n_slots) * b;
    return int(it - pool.begin());
  }

  // Memory for a slot the policy just created: the lowest free position of the class's chunks
  // (so fills made together sit side by side and copy as one range), else a new chunk.
  void assign_slot(int slot, int cls) {
    std::vector<Chunk>& pool = pools[size_t(cls)];
    const size_t b = policy->class_slot_bytes(cls);
    int ci = -1, pos = -1;
    for (size_t c = 0; c < pool.size() && ci < 0; ++c) {
      if (!pool[c].dev || pool[c].n_used == int(pool[c].used.size())) continue;
      ci = int(c);
      pos = int(std::find(pool[c].used.begin(), pool[c].used.end(), 0) - pool[c].used.begin());
    }
    if (ci < 0) {
      const size_t room = budget > reserved_bytes ? budget - reserved_bytes : 0;
      const size_t n = std::clamp<size_t>(std::min(opts.chunk_bytes, room) / b, 1,
                                          std::max<size_t>(budget / b, 1));
      ci = add_chunk(cls, int(n));
      pos = 0;
    }
    Chunk& c = pool[size_t(ci)];
    c.used[size_t(pos)] = 1;
    ++c.n_used;
    if (slot_mem.size() <= size_t(slot)) slot_mem.resize(size_t(slot) + 1);
    slot_mem[size_t(slot)] = SlotMem{cls, ci, pos, c.dev + size_t(pos) * b, 0};
  }

  // The policy gave slot `slot` up (another class needed the bytes): its position is free, and
  // a chunk with no position left in use goes back to the device once copies into it are done.
  void release_slot(int slot) {
    SlotMem& m = slot_mem.at(size_t(slot));
    MOE_ASSERT(m.dev, "released slot has no memory");
    Chunk& c = pools[size_t(m.cls)][size_t(m.chunk)];
    c.used[size_t(m.pos)] = 0;
    if (--c.n_used == 0) {
      free_later.emplace_back(next_seq, c.dev);
      reserved_bytes -= c.used.size() * policy->class_slot_bytes(m.cls);
      c.dev = nullptr;
      c.used.clear();
    }
    m = SlotMem{};
  }

  void ensure_scratch(size_t bytes) {
    if (bytes <= scratch_bytes) return;
    // Growing: the old area may still be read by kernels or written by copies.
    if (scratch) {
      MOE_CUDA_CHECK(cudaEventSynchronize(scratch_free));
      MOE_CUDA_CHECK(cudaStreamSynchronize(copy));
      poll();
      MOE_CUDA_CHECK(cudaFree(scratch));
      scratch = nullptr;
      scratch_bytes = 0;
    }
    scratch = device_alloc(bytes);
    scratch_bytes = bytes;
  }

  void release_all_memory() {
    for (auto& pool : pools)
      for (Chunk& c : pool)
        if (c.dev) cudaFree(c.dev);
    pools.assign(pools.size(), {});
    for (auto& f : free_later) cudaFree(f.second);
    free_later.clear();
    if (scratch) cudaFree(scratch);
    scratch = nullptr;
    scratch_bytes = 0;
    slot_mem.clear();
    reserved_bytes = 0;
  }

  // VRAM pressure and failed reads: waits for both streams, frees every slot and the scratch
  // area and starts the policy afresh (its counters are kept in policy_base).
  void flush() {
    MOE_CUDA_CHECK(cudaStreamSynchronize(compute));
    MOE_CUDA_CHECK(cudaStreamSynchronize(copy));
    while (!batches.empty()) retire_front_batch();
    for (const KernelGroup& g : kernel_groups) spare_events.push_back(g.done);
    kernel_groups.clear();
    current_pins.clear();
    current_scratch = false;
    scratch_recorded = false;
    staging_head = 0;
    release_all_memory();
    add_stats(policy_base, policy->stats());
    add_stats(policy_base, policy_offset, -1);
    policy_offset = GpuCacheStats{};
    policy.emplace(budget, cfg.n_experts, layer_bytes);
  }

  // Runs `op` (which must change no state before its allocations are done, or only state that
  // flush() resets); a failed device allocation flushes the cache and retries once.
  template <class Op>
  void with_vram_retry(Op&& op) {
    try {
      op();
      return;
    } catch (const DeviceOom&) {
    }
    flush();
    ++tel.alloc_retries;
    try {
      op();
    } catch (const DeviceOom& oom) {
      flush();
      throw Error("gpu cache: cannot allocate " + mib(oom.bytes) + " (" +
                  std::to_string(oom.bytes) + " bytes) of device memory for experts, even after "
                  "releasing every cached expert (" + memory_report() + "); lower --gpu-cache-mb");
    }
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

  // ---- staging and copies -------------------------------------------------------------------
  // `n` contiguous bytes of staging that no in-flight copy reads.
  size_t reserve_staging(size_t n) {
    MOE_ASSERT(n <= staging_bytes, "staging request larger than the ring");
    size_t start = staging_head + n <= staging_bytes ? staging_head : 0;
    uint64_t must_finish = 0;
    for (const Batch& b : batches)
      if (b.stage_begin < start + n && start < b.stage_end) must_finish = b.seq;
    if (must_finish) wait_batch(must_finish);
    staging_head = start + n;
    return start;
  }

  void issue_runs(std::vector<void*>& dst, std::vector<const void*>& src,
                  std::vector<size_t>& sizes) {
    const size_t n = dst.size();
#if CUDART_VERSION >= 12080
    if (n > 1 && opts.batch_copies) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
      cudaError_t e = cudaMemcpyBatchAsync(dst.data(), src.data(), sizes.data(), n, &attr,
                                           &attr_idx, 1, copy);
#else
      size_t fail_idx = 0;
      cudaError_t e = cudaMemcpyBatchAsync(dst.data(), const_cast<void**>(src.data()), sizes.data(),
                                           n, &attr, &attr_idx, 1, &fail_idx, copy);
#endif
      if (e == cudaSuccess) return;
      // A driver older than the runtime: plain copies from now on.
      cudaGetLastError();
      opts.batch_copies = false;
    }
#endif
    for (size_t i = 0; i < n; ++i)
      MOE_CUDA_CHECK(cudaMemcpyAsync(dst[i], src[i], sizes[i], cudaMemcpyHostToDevice, copy));
  }

  // Stages and copies `cs` (sorted here by destination) in groups that fit half the ring, so one
  // group is staged while the previous one copies. Returns the seq of the last batch.
  uint64_t upload(std::vector<Copy>& cs) {
    std::sort(cs.begin(), cs.end(), [](const Copy& a, const Copy& b) { return a.dst < b.dst; });
    const size_t group_cap = staging_bytes / 2;
    std::vector<void*> dst;
    std::vector<const void*> src;
    std::vector<size_t> sizes;
    size_t i = 0;
    while (i < cs.size()) {
      size_t j = i, total = 0;
      while (j < cs.size() && (j == i || total + cs[j].bytes <= group_cap)) total += cs[j++].bytes;
      const size_t start = reserve_staging(total);
      dst.clear(), src.clear(), sizes.clear();
      size_t off = start;
      for (size_t k = i; k < j; ++k) {
        std::memcpy(staging + off, cs[k].src, cs[k].bytes);
        // Adjacent on the device and (by construction) in staging: one copy.
        if (!dst.empty() && static_cast<uint8_t*>(dst.back()) + sizes.back() == cs[k].dst) {
          sizes.back() += cs[k].bytes;
        } else {
          dst.push_back(cs[k].dst);
          src.push_back(staging + off);
          sizes.push_back(cs[k].bytes);
        }
        off += cs[k].bytes;
      }
      issue_runs(dst, src, sizes);
      tel.h2d_copies += dst.size();
      tel.h2d_bytes += total;
      Batch b{++next_seq, take_event(), start, start + total};
      MOE_CUDA_CHECK(cudaEventRecord(b.done, copy));
      batches.push_back(b);
      for (size_t k = i; k < j; ++k)
        if (cs[k].slot >= 0) slot_mem[size_t(cs[k].slot)].fill_seq = b.seq;
      i = j;
    }
    return next_seq;
  }

  // Reads `cs[i]` = expert ids[i] of `layer` through the store (host tiers first).
  void read(int layer, const std::vector<int>& ids, std::vector<Copy>& cs) {
    store.begin_fetch(layer, ids);
    size_t index = 0;
    const uint8_t* payload = nullptr;
    size_t got = 0;
    while (store.next_ready(&index, &payload, true)) {
      MOE_ASSERT(index < cs.size() && !cs[index].src, "store handed out an expert twice");
      cs[index].src = payload;
      ++got;
    }
    MOE_ASSERT(got == cs.size(), "store handed out fewer experts than asked");
  }

  // ---- operations ---------------------------------------------------------------------------
  void close_kernel_group() {
    if (current_pins.empty() && !current_scratch) return;
    KernelGroup g{take_event(), std::move(current_pins)};
    MOE_CUDA_CHECK(cudaEventRecord(g.done, compute));
    kernel_groups.push_back(std::move(g));
    current_pins.clear();
    if (current_scratch) {
      MOE_CUDA_CHECK(cudaEventRecord(scratch_free, compute));
      scratch_recorded = true;
    }
    current_scratch = false;
  }

  void check_layer(int layer, const char* what) const {
    if (layer < 0 || layer >= cfg.n_layers)
      throw ConfigError(std::string("gpu cache: ") + what + " of layer " + std::to_string(layer) +
                        " outside 0.." + std::to_string(cfg.n_layers - 1));
  }

  void acquire(int layer, std::span<const int> ids, GpuFill kind, std::span<const uint8_t*> dev_out) {
    check_layer(layer, "acquire");
    if (kind == GpuFill::kSpeculative)
      throw ConfigError("gpu cache: acquire takes kDemand or kPrefill; predictions go to prefetch()");
    if (dev_out.size() != ids.size())
      throw ConfigError("gpu cache: acquire of " + std::to_string(ids.size()) + " experts with " +
                        std::to_string(dev_out.size()) + " output pointers");
    for (int id : ids)
      if (id < 0 || id >= cfg.n_experts)
        throw ConfigError("gpu cache: acquire of expert " + std::to_string(id) + " of layer " +
                          std::to_string(layer) + " outside 0.." + std::to_string(cfg.n_experts - 1));
    // A new acquire means the kernels of the previous one are enqueued by now.
    close_kernel_group();
    poll();

    // Unique ids, first occurrence first: heat counts an expert once per call.
    std::vector<int> uniq;
    std::vector<int> first(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = std::find(uniq.begin(), uniq.end(), ids[i]);
      first[i] = int(it - uniq.begin());
      if (it == uniq.end()) uniq.push_back(ids[i]);
    }
    const size_t b = layer_bytes[size_t(layer)];
    const int cls = policy->class_of_layer(layer);
    std::vector<const uint8_t*> dev(uniq.size());
    std::vector<int> miss_ids;
    std::vector<Copy> cs;
    uint64_t wait_seq = 0;

    with_vram_retry([&] {
      miss_ids.clear();
      cs.clear();
      wait_seq = 0;
      std::vector<size_t> to_scratch;  // indices into uniq
      for (size_t u = 0; u < uniq.size(); ++u) {
        GpuCacheResult r = policy->access(layer, uniq[u], kind);
        for (int s : r.released_slots) release_slot(s);
        switch (r.outcome) {
          case GpuCacheOutcome::kHit: {
            policy->pin(r.slot);
            current_pins.push_back(r.slot);
            const SlotMem& m = slot_mem[size_t(r.slot)];
            dev[u] = m.dev;
            // A prefetched copy may still be in flight: compute waits for it.
            if (m.fill_seq > completed_seq) wait_seq = std::max(wait_seq, m.fill_seq);
            break;
          }
          case GpuCacheOutcome::kFilled:
            if (r.slot_allocated) assign_slot(r.slot, cls);
            policy->pin(r.slot);
            current_pins.push_back(r.slot);
            dev[u] = slot_mem[size_t(r.slot)].dev;
            miss_ids.push_back(uniq[u]);
            cs.push_back(Copy{slot_mem[size_t(r.slot)].dev, nullptr, b, r.slot});
            break;
          case GpuCacheOutcome::kNoRoom:
            to_scratch.push_back(u);
            break;
          case GpuCacheOutcome::kDropped:
            MOE_ASSERT(false, "a demand or prefill fill was dropped");
        }
      }
      if (!to_scratch.empty()) {
        ensure_scratch(to_scratch.size() * b);
        for (size_t k = 0; k < to_scratch.size(); ++k) {
          const size_t u = to_scratch[k];
          dev[u] = scratch + k * b;
          miss_ids.push_back(uniq[u]);
          cs.push_back(Copy{scratch + k * b, nullptr, b, -1});
        }
        current_scratch = true;
        tel.scratch_uses += to_scratch.size();
      }
    });

    if (!cs.empty()) {
      flush_on_error([&] {
        const auto t0 = std::chrono::steady_clock::now();
        read(layer, miss_ids, cs);
        tel.demand_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // Scratch is rewritten: kernels of an earlier call that read it must be done first.
        if (current_scratch && scratch_recorded) MOE_CUDA_CHECK(cudaStreamWaitEvent(copy, scratch_free, 0));
        wait_seq = upload(cs);
      });
    }
    if (wait_seq > completed_seq) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, batch_event(wait_seq), 0));
    for (size_t i = 0; i < ids.size(); ++i) dev_out[i] = dev[size_t(first[i])];
  }

  void prefetch(int layer, std::span<const int> ids) {
    check_layer(layer, "prefetch");
    poll();
    std::vector<int> uniq;
    for (int id : ids) {
      if (id < 0 || id >= cfg.n_experts) {
        ++tel.prefetch_ignored;
        continue;
      }
      if (std::find(uniq.begin(), uniq.end(), id) == uniq.end()) uniq.push_back(id);
    }
    const size_t b = layer_bytes[size_t(layer)];
    const int cls = policy->class_of_layer(layer);
    std::vector<int> fill_ids;
    std::vector<Copy> cs;
    with_vram_retry([&] {
      fill_ids.clear();
      cs.clear();
      for (int id : uniq) {
        GpuCacheResult r = policy->access(layer, id, GpuFill::kSpeculative);
        for (int s : r.released_slots) release_slot(s);
        if (r.outcome != GpuCacheOutcome::kFilled) continue;
        if (r.slot_allocated) assign_slot(r.slot, cls);
        fill_ids.push_back(id);
        cs.push_back(Copy{slot_mem[size_t(r.slot)].dev, nullptr, b, r.slot});
      }
    });
    if (cs.empty()) return;
    flush_on_error([&] {
      read(layer, fill_ids, cs);
      upload(cs);
    });
  }

  GpuCacheTelemetry telemetry() const {
    GpuCacheTelemetry t = tel;
    t.policy = policy_base;
    add_stats(t.policy, policy->stats());
    add_stats(t.policy, policy_offset, -1);
    t.prefetch_issued = t.policy.speculative_fills;
    t.prefetch_used = t.policy.speculative_used;
    t.prefetch_dropped = t.policy.speculative_dropped;
    return t;
  }
};

GpuExpertCache::GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                               gpu::Stream compute)
    : GpuExpertCache(cfg, store, budget_bytes, compute, GpuExpertCacheOptions{}) {}

GpuExpertCache::GpuExpertCache(const ModelConfig& cfg, ExpertStore& store, size_t budget_bytes,
                               gpu::Stream compute, const GpuExpertCacheOptions& opts)
    : impl_(std::make_unique<Impl>(cfg, store, budget_bytes, compute, opts)) {}

GpuExpertCache::~GpuExpertCache() = default;

void GpuExpertCache::acquire(int layer, std::span<const int> ids, GpuFill kind,
                             std::span<const uint8_t*> dev_out) {
  impl_->acquire(layer, ids, kind, dev_out);
}

void GpuExpertCache::kernels_enqueued() { impl_->close_kernel_group(); }

void GpuExpertCache::prefetch(int layer, std::span<const int> ids) { impl_->prefetch(layer, ids); }

void GpuExpertCache::end_step() {
  impl_->policy->advance_step();
  impl_->poll();
}

GpuCacheTelemetry GpuExpertCache::telemetry() const { return impl_->telemetry(); }

void GpuExpertCache::reset_telemetry() {
  impl_->tel = GpuCacheTelemetry{};
  impl_->policy_base = GpuCacheStats{};
  impl_->policy_offset = impl_->policy->stats();  // the policy's counters only grow
}

size_t GpuExpertCache::budget_bytes() const { return impl_->budget; }

size_t GpuExpertCache::expert_bytes(int layer) const {
  impl_->check_layer(layer, "expert_bytes");
  return impl_->layer_bytes[size_t(layer)];
}

const uint8_t* GpuExpertCache::resident_payload(int layer, int expert) const {
  impl_->check_layer(layer, "resident_payload");
  if (expert < 0 || expert >= impl_->cfg.n_experts) return nullptr;
  const int s = impl_->policy->slot_of(layer, expert);
  return s < 0 ? nullptr : impl_->slot_mem[size_t(s)].dev;
}

void GpuExpertCache::inject_alloc_failures(int n) { impl_->inject_failures = n; }

}  // namespace moestream
