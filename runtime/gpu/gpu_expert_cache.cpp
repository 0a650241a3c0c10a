// Implementation of runtime/gpu/gpu_expert_cache.h: slot chunks per size class, the pinned staging
// ring, the copy stream and the events that order copies, kernels and staging reuse.
//
// Ordering rests on two in-order streams:
// - Copy batches are numbered (seq) on the copy stream, so "batch N done" implies every earlier
//   batch done: one completed_seq answers whether a slot's bytes, or a staging range, are free.
// - Kernel groups (one per acquire, closed by kernels_enqueued) complete in order on `compute`;
//   their slots stay pinned in the policy until the group's event has completed.
// - Predictions go to a worker thread with its own store, staging and copy stream. The host
//   thread alone touches the policy and slot memory: it places and pins a predicted slot, the
//   worker only reads and copies into it and records the job's event; a job's state (under mu)
//   says how far it got, and the host unpins the slot once the job's event has completed.
#include "runtime/gpu/gpu_expert_cache.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"

namespace moestream {

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// Pinned staging: at least 64 MiB (a whole Qwen3-30B q4 layer's demand, 8 x 2.6 MB, fits four
// times), at most 1 GiB (Mixtral-size experts), always two of the largest expert.
constexpr size_t kStagingMinBytes = 64 * kMiB;
constexpr size_t kStagingMaxBytes = 1024 * kMiB;
// The prefetch worker's staging: 64 MiB holds a look-ahead of 24 Qwen3-30B q4 experts in flight.
constexpr size_t kPrefetchStagingBytes = 64 * kMiB;

struct DeviceOom {
  size_t bytes;
};

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

std::string mib(size_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

}  // namespace

struct GpuExpertCache::Impl {
  // A predicted expert on its way to its slot. kQueued/kReading: cancellable (the worker copies
  // nothing); kCopying: the worker is issuing the copy; kIssued: `done` is recorded after it.
  enum class JobState { kQueued, kReading, kCopying, kIssued, kCancelled, kFailed };
  struct Job {
    int layer, expert, slot;
    uint8_t* dst;
    size_t bytes;
    cudaEvent_t done;
    JobState state = JobState::kQueued;  // guarded by mu
  };
  using JobPtr = std::shared_ptr<Job>;
  struct Chunk {
    uint8_t* dev = nullptr;    // nullptr: entry unused (freed), reusable
    std::vector<uint8_t> used; // by position
    int n_used = 0;
  };
  struct SlotMem {             // by policy slot index
    int cls = -1, chunk = -1, pos = -1;
    uint8_t* dev = nullptr;
    uint64_t fill_seq = 0;     // copy batch that last wrote the slot (0: none)
    std::shared_ptr<Job> job;  // the prediction filling it, until its copy has completed
    bool valid = true;         // false: a cancelled prediction, its bytes never written
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
  std::optional<LfruPolicy> policy;
  CacheStats policy_base;      // policy stats from before the last flush, since the last reset
  CacheStats policy_offset;    // the live policy's stats at the last reset_telemetry()
  GpuCacheTelemetry tel;

  std::vector<std::vector<Chunk>> pools;  // by class
  std::vector<SlotMem> slot_mem;
  size_t reserved_bytes = 0;              // bytes of live chunks
  std::vector<std::pair<uint64_t, uint8_t*>> free_later;  // chunk freed once batch seq is done

  uint8_t* staging = nullptr;
  size_t staging_bytes = 0, staging_head = 0;
  uint64_t next_seq = 0, completed_seq = 0;
  std::deque<Batch> batches;

  // Between begin_acquire() and finish_acquire(): what is still to be read and waited for.
  struct Pending {
    bool active = false;
    int layer = 0;
    CacheFill kind = CacheFill::kDemand;
    std::vector<int> miss_ids;
    std::vector<Copy> cs;
    std::vector<JobPtr> predicted;  // hits whose prediction is queued or in flight
    uint64_t refills = 0;
  } pending;
  std::vector<int> current_pins;   // slots of the last acquire(), kernels not yet enqueued
  bool current_scratch = false;
  std::deque<KernelGroup> kernel_groups;
  uint8_t* scratch = nullptr;
  size_t scratch_bytes = 0;
  cudaEvent_t scratch_free = nullptr;  // recorded after the kernels that last read scratch
  bool scratch_recorded = false;
  std::vector<cudaEvent_t> spare_events;
  int inject_failures = 0;
  uint64_t refills_demand = 0, refills_prefill = 0, requeued = 0;  // telemetry corrections

  // Prefetch worker. `jobs` (host thread only) are the predictions whose slot pin is held.
  std::vector<JobPtr> jobs;
  mutable std::mutex mu;
  std::condition_variable cv_worker, cv_host;
  std::deque<std::vector<JobPtr>> queue;  // guarded by mu: one group per prefetch()
  bool stop = false;                      // guarded by mu
  std::exception_ptr worker_error;        // guarded by mu
  uint64_t worker_h2d_bytes = 0, worker_h2d_copies = 0;  // guarded by mu
  cudaStream_t pf_copy = nullptr;
  int device = 0;
  // Worker only: staging entries of one expert each, reused once their copy has completed.
  uint8_t* pf_staging = nullptr;
  size_t pf_entry_bytes = 0;
  std::vector<cudaEvent_t> pf_entry_done;
  std::vector<uint8_t> pf_entry_used;
  size_t pf_next = 0;
  std::thread worker;

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
    if (opts.prefetch_store) start_worker(max_bytes);
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
    if (worker.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu);
        stop = true;
        queue.clear();
        for (const JobPtr& j : jobs)
          if (j->state == JobState::kQueued || j->state == JobState::kReading)
            j->state = JobState::kCancelled;
      }
      cv_worker.notify_all();
      worker.join();  // it finishes the read in hand (an engine store writes into its buffers)
    }
    if (pf_copy) cudaStreamSynchronize(pf_copy);
    for (const JobPtr& j : jobs) cudaEventDestroy(j->done);
    jobs.clear();
    for (cudaEvent_t e : pf_entry_done) cudaEventDestroy(e);
    pf_entry_done.clear();
    if (pf_staging) cudaFreeHost(pf_staging);
    pf_staging = nullptr;
    if (pf_copy) cudaStreamDestroy(pf_copy);
    pf_copy = nullptr;
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
    if (!jobs.empty()) {
      std::lock_guard<std::mutex> lk(mu);
      std::erase_if(jobs, [&](const JobPtr& j) {
        if (j->state != JobState::kIssued || !done(j->done)) return false;
        release_job(*j);
        return true;
      });
    }
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
    slot_mem[size_t(slot)] = SlotMem{cls, ci, pos, c.dev + size_t(pos) * b, 0, nullptr, true};
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
    drain_worker();
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
    policy_offset = CacheStats{};
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

  // Reads `cs[i]` = expert ids[i] of `layer` through the store (host tiers first) and copies
  // each as soon as it has landed: one next_ready() that waits, plus every other expert ready by
  // then, is one copy batch, so the copies of early experts overlap the reads of late ones.
  // Returns the seq of the last batch (0: nothing to copy).
  uint64_t read_and_upload(int layer, const std::vector<int>& ids, std::vector<Copy>& cs) {
    store.begin_fetch(layer, ids);
    std::vector<Copy> landed;
    size_t index = 0, got = 0;
    const uint8_t* payload = nullptr;
    uint64_t last = 0;
    auto take = [&] {
      MOE_ASSERT(index < cs.size() && !cs[index].src, "store handed out an expert twice");
      cs[index].src = payload;
      landed.push_back(cs[index]);
      ++got;
    };
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      const bool any = store.next_ready(&index, &payload, true);
      tel.demand_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!any) break;
      landed.clear();
      take();
      while (store.next_ready(&index, &payload, false)) take();
      last = upload(landed);
    }
    MOE_ASSERT(got == cs.size(), "store handed out fewer experts than asked");
    return last;
  }

  // ---- prefetch worker ----------------------------------------------------------------------
  void start_worker(size_t max_bytes) {
    MOE_CUDA_CHECK(cudaGetDevice(&device));
    MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&pf_copy, cudaStreamNonBlocking));
    pf_entry_bytes = max_bytes;
    const size_t want = opts.prefetch_staging_bytes ? opts.prefetch_staging_bytes : kPrefetchStagingBytes;
    const size_t n = std::clamp<size_t>(want / max_bytes, 2, 1024);
    if (cudaError_t e = cudaMallocHost(&pf_staging, n * max_bytes); e != cudaSuccess) {
      cudaGetLastError();
      pf_staging = nullptr;
      throw Error("gpu cache: cannot allocate " + mib(n * max_bytes) +
                  " of pinned host staging for prefetches: " + cudaGetErrorString(e));
    }
    pf_entry_done.resize(n);
    pf_entry_used.assign(n, 0);
    for (cudaEvent_t& e : pf_entry_done) MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    worker = std::thread([this] { worker_loop(); });
  }

  // Worker thread: one group (one prefetch() call) at a time, in order; each expert is copied
  // as soon as its read lands, unless the host cancelled it meanwhile.
  void worker_loop() {
    cudaSetDevice(device);
    std::vector<int> ids;
    for (;;) {
      std::vector<JobPtr> group;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv_worker.wait(lk, [&] { return stop || !queue.empty(); });
        if (stop) return;
        group = std::move(queue.front());
        queue.pop_front();
        std::erase_if(group, [](const JobPtr& j) { return j->state != JobState::kQueued; });
        for (const JobPtr& j : group) j->state = JobState::kReading;
      }
      if (group.empty()) continue;
      ids.clear();
      for (const JobPtr& j : group) ids.push_back(j->expert);
      try {
        opts.prefetch_store->begin_fetch(group[0]->layer, ids);
        size_t i = 0;
        const uint8_t* payload = nullptr;
        while (opts.prefetch_store->next_ready(&i, &payload, true)) {
          MOE_ASSERT(i < group.size(), "store handed out an expert it was not asked for");
          Job& j = *group[i];
          {
            std::lock_guard<std::mutex> lk(mu);
            if (j.state != JobState::kReading) continue;  // cancelled: nothing to copy
            j.state = JobState::kCopying;
          }
          copy_prediction(j, payload);
          {
            std::lock_guard<std::mutex> lk(mu);
            j.state = JobState::kIssued;
            worker_h2d_bytes += j.bytes;
            ++worker_h2d_copies;
          }
          cv_host.notify_all();
        }
      } catch (...) {
        {
          std::lock_guard<std::mutex> lk(mu);
          if (!worker_error) worker_error = std::current_exception();
          for (const JobPtr& j : group)
            if (j->state == JobState::kReading || j->state == JobState::kCopying)
              j->state = JobState::kFailed;
        }
        cv_host.notify_all();
      }
    }
  }

  // Worker thread: stage one expert and copy it on the prefetch stream; the job's event follows.
  void copy_prediction(Job& j, const uint8_t* payload) {
    const size_t e = pf_next;
    pf_next = (pf_next + 1) % pf_entry_done.size();
    if (pf_entry_used[e]) MOE_CUDA_CHECK(cudaEventSynchronize(pf_entry_done[e]));
    uint8_t* st = pf_staging + e * pf_entry_bytes;
    std::memcpy(st, payload, j.bytes);
    MOE_CUDA_CHECK(cudaMemcpyAsync(j.dst, st, j.bytes, cudaMemcpyHostToDevice, pf_copy));
    MOE_CUDA_CHECK(cudaEventRecord(pf_entry_done[e], pf_copy));
    MOE_CUDA_CHECK(cudaEventRecord(j.done, pf_copy));
    pf_entry_used[e] = 1;
  }

  // Host thread, under mu: the job no longer holds its slot (its copy completed, or it was
  // cancelled before any copy).
  void release_job(Job& j) {
    policy->unpin(j.slot);
    SlotMem& m = slot_mem[size_t(j.slot)];
    if (m.job.get() == &j) m.job.reset();
    spare_events.push_back(j.done);
  }

  // Host thread: predictions of `layer` that demand did not ask for and that the worker has not
  // begun copying are cancelled; their slots keep their place in the policy but are marked
  // invalid, so a later demand reads them like a miss.
  void cancel_unasked(int layer, const std::vector<int>& asked) {
    if (jobs.empty()) return;
    std::lock_guard<std::mutex> lk(mu);
    std::erase_if(jobs, [&](const JobPtr& j) {
      if (j->layer != layer || std::find(asked.begin(), asked.end(), j->expert) != asked.end())
        return false;
      if (j->state != JobState::kQueued && j->state != JobState::kReading) return false;
      j->state = JobState::kCancelled;
      slot_mem[size_t(j->slot)].valid = false;
      release_job(*j);
      ++tel.prefetch_cancelled;
      return true;
    });
  }

  // Host thread: a demanded prediction the worker has not begun reading is taken back, so the
  // demand reads it now instead of waiting behind the worker's earlier reads. The slot stays
  // valid (this acquire writes it).
  bool steal(Job& j) {
    std::lock_guard<std::mutex> lk(mu);
    if (j.state != JobState::kQueued) return false;
    j.state = JobState::kCancelled;
    release_job(j);
    std::erase_if(jobs, [&](const JobPtr& p) { return p.get() == &j; });
    return true;
  }

  // Host thread: no prediction is being copied and none will be (flush, errors).
  void drain_worker() {
    if (!worker.joinable()) return;
    {
      std::unique_lock<std::mutex> lk(mu);
      for (const JobPtr& j : jobs)
        if (j->state == JobState::kQueued || j->state == JobState::kReading)
          j->state = JobState::kCancelled;
      cv_host.wait(lk, [&] {
        return std::none_of(jobs.begin(), jobs.end(),
                            [](const JobPtr& j) { return j->state == JobState::kCopying; });
      });
    }
    MOE_CUDA_CHECK(cudaStreamSynchronize(pf_copy));
    for (const JobPtr& j : jobs) spare_events.push_back(j->done);
    jobs.clear();
  }

  // A read error of the worker reaches the caller on its next call, after a flush (the slots
  // the policy holds for the failed predictions have no bytes).
  void check_worker_error() {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lk(mu);
      e = std::exchange(worker_error, nullptr);
    }
    if (!e) return;
    flush();
    std::rethrow_exception(e);
  }

  // Host thread: the demanded expert of `j` is on its way; compute waits for its copy.
  void await_prediction(const JobPtr& j) {
    JobState st;
    {
      std::unique_lock<std::mutex> lk(mu);
      if (j->state != JobState::kIssued && j->state != JobState::kFailed) {
        ++tel.prefetch_waits;
        const auto t0 = std::chrono::steady_clock::now();
        cv_host.wait(lk, [&] { return j->state == JobState::kIssued || j->state == JobState::kFailed; });
        tel.prefetch_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      st = j->state;
    }
    if (st == JobState::kFailed) {
      check_worker_error();
      throw Error("gpu cache: a prefetch failed without an error");  // not reached
    }
    if (!done(j->done)) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, j->done, 0));
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

  void require_worker() const {
    if (!opts.prefetch_store)
      throw ConfigError("gpu cache: prefetch() needs a prefetch store for its worker thread "
                        "(GpuExpertCacheOptions::prefetch_store, e.g. ExpertStore::reopen())");
  }

  // A prediction's ids in range, each once; the others are counted as ignored.
  std::vector<int> prediction_ids(std::span<const int> ids) {
    std::vector<int> uniq;
    for (int id : ids) {
      if (id < 0 || id >= cfg.n_experts) {
        ++tel.prefetch_ignored;
        continue;
      }
      if (std::find(uniq.begin(), uniq.end(), id) == uniq.end()) uniq.push_back(id);
    }
    return uniq;
  }

  // Inside a with_vram_retry op: speculative placements under the eviction guard; each placed
  // slot (expert, slot) is pinned at once, so a later fill of the same call cannot take it.
  void place_predictions(int layer, const std::vector<int>& uniq,
                         std::vector<std::pair<int, int>>& placed, uint64_t& again) {
    const int cls = policy->class_of_layer(layer);
    for (int id : uniq) {
      CacheAccess r = policy->access({layer, id}, CacheFill::kSpeculative);
      for (int s : r.released_slots) release_slot(s);
      if (r.outcome == CacheOutcome::kFilled) {
        if (r.slot_allocated) assign_slot(r.slot, cls);
      } else if (r.outcome == CacheOutcome::kHit && !slot_mem[size_t(r.slot)].valid &&
                 !slot_mem[size_t(r.slot)].job) {
        ++again;  // predicted again after a cancellation: the bytes are still to be read
      } else {
        continue;
      }
      policy->pin(r.slot);
      placed.emplace_back(id, r.slot);
    }
  }

  // The placed predictions as one group for the worker (it reads them with one begin_fetch).
  void queue_predictions(int layer, const std::vector<std::pair<int, int>>& placed) {
    if (placed.empty()) return;
    const size_t b = layer_bytes[size_t(layer)];
    std::vector<JobPtr> group;
    for (const auto& [id, slot] : placed) {
      SlotMem& m = slot_mem[size_t(slot)];
      auto j = std::make_shared<Job>(Job{layer, id, slot, m.dev, b, take_event()});
      m.job = j;
      m.valid = true;
      jobs.push_back(j);
      group.push_back(std::move(j));
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      queue.push_back(std::move(group));
    }
    cv_worker.notify_one();
  }

  // pf_layer >= 0: after this call's own placements (pinned, so a prediction cannot evict
  // them) and before its reads, predictions pf_ids of pf_layer go to the worker.
  void begin_acquire(int layer, std::span<const int> ids, CacheFill kind,
                     std::span<const uint8_t*> dev_out, std::span<uint8_t> ready,
                     int pf_layer = -1, std::span<const int> pf_ids = {}) {
    require_idle("begin_acquire");
    check_layer(layer, "acquire");
    if (pf_layer >= 0) {
      check_layer(pf_layer, "prefetch");
      require_worker();
    }
    if (kind == CacheFill::kSpeculative)
      throw ConfigError("gpu cache: acquire takes kDemand or kPrefill; predictions go to prefetch()");
    if (dev_out.size() != ids.size())
      throw ConfigError("gpu cache: acquire of " + std::to_string(ids.size()) + " experts with " +
                        std::to_string(dev_out.size()) + " output pointers");
    if (ready.size() != ids.size())
      throw ConfigError("gpu cache: begin_acquire of " + std::to_string(ids.size()) +
                        " experts with " + std::to_string(ready.size()) + " ready flags");
    for (int id : ids)
      if (id < 0 || id >= cfg.n_experts)
        throw ConfigError("gpu cache: acquire of expert " + std::to_string(id) + " of layer " +
                          std::to_string(layer) + " outside 0.." + std::to_string(cfg.n_experts - 1));
    check_worker_error();
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
    std::vector<uint8_t> now(uniq.size());  // usable by compute once wait_seq is waited for
    std::vector<int>& miss_ids = pending.miss_ids;
    std::vector<Copy>& cs = pending.cs;
    uint64_t wait_seq = 0;
    cancel_unasked(layer, uniq);
    std::vector<JobPtr>& predicted = pending.predicted;
    std::vector<size_t> predicted_u;  // predicted[k] is uniq[predicted_u[k]]
    uint64_t& refills = pending.refills;
    const std::vector<int> pf_uniq = pf_layer >= 0 ? prediction_ids(pf_ids) : std::vector<int>{};
    std::vector<std::pair<int, int>> pf_placed;
    uint64_t pf_again = 0;

    with_vram_retry([&] {
      miss_ids.clear();
      cs.clear();
      wait_seq = 0;
      predicted.clear();
      predicted_u.clear();
      refills = 0;
      std::fill(now.begin(), now.end(), 0);
      std::vector<size_t> to_scratch;  // indices into uniq
      for (size_t u = 0; u < uniq.size(); ++u) {
        CacheAccess r = policy->access({layer, uniq[u]}, kind);
        for (int s : r.released_slots) release_slot(s);
        switch (r.outcome) {
          case CacheOutcome::kHit: {
            policy->pin(r.slot);
            current_pins.push_back(r.slot);
            SlotMem& m = slot_mem[size_t(r.slot)];
            dev[u] = m.dev;
            if (m.job && steal(*m.job)) {  // still queued: read it here, the worker won't
              ++refills;
              miss_ids.push_back(uniq[u]);
              cs.push_back(Copy{m.dev, nullptr, b, r.slot});
            } else if (m.job) {  // its prediction is being read or copied: never read twice
              predicted.push_back(m.job);
              predicted_u.push_back(u);
            } else if (!m.valid) {  // a cancelled prediction: read it now
              m.valid = true;
              ++refills;
              miss_ids.push_back(uniq[u]);
              cs.push_back(Copy{m.dev, nullptr, b, r.slot});
            } else {
              now[u] = 1;
              if (m.fill_seq > completed_seq)  // a demand copy may still be in flight
                wait_seq = std::max(wait_seq, m.fill_seq);
            }
            break;
          }
          case CacheOutcome::kFilled:
            if (r.slot_allocated) assign_slot(r.slot, cls);
            policy->pin(r.slot);
            current_pins.push_back(r.slot);
            slot_mem[size_t(r.slot)].valid = true;
            dev[u] = slot_mem[size_t(r.slot)].dev;
            miss_ids.push_back(uniq[u]);
            cs.push_back(Copy{slot_mem[size_t(r.slot)].dev, nullptr, b, r.slot});
            break;
          case CacheOutcome::kNoRoom:
            to_scratch.push_back(u);
            break;
          case CacheOutcome::kDropped:
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
      pf_placed.clear();
      pf_again = 0;
      if (!pf_uniq.empty()) place_predictions(pf_layer, pf_uniq, pf_placed, pf_again);
    });
    requeued += pf_again;
    queue_predictions(pf_layer, pf_placed);  // the worker reads them while we read ours

    // Predictions whose copy the worker has issued are usable now too (a compute wait on the
    // job's event, no host wait); the others are awaited in finish_acquire().
    for (size_t k = 0; k < predicted.size();) {
      bool issued;
      {
        std::lock_guard<std::mutex> lk(mu);
        issued = predicted[k]->state == JobState::kIssued;
      }
      if (!issued) {
        ++k;
        continue;
      }
      await_prediction(predicted[k]);
      now[predicted_u[k]] = 1;
      predicted.erase(predicted.begin() + ptrdiff_t(k));
      predicted_u.erase(predicted_u.begin() + ptrdiff_t(k));
    }
    // Hits usable now: their in-flight copies (earlier calls) are already issued, a stream wait.
    if (wait_seq > completed_seq) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, batch_event(wait_seq), 0));
    for (size_t i = 0; i < ids.size(); ++i) {
      dev_out[i] = dev[size_t(first[i])];
      ready[i] = now[size_t(first[i])];
    }
    pending.active = true;
    pending.layer = layer;
    pending.kind = kind;
  }

  void finish_acquire() {
    if (!pending.active) throw ConfigError("gpu cache: finish_acquire without begin_acquire");
    pending.active = false;
    uint64_t wait_seq = 0;
    if (!pending.cs.empty()) {
      flush_on_error([&] {
        // Scratch is rewritten: kernels of an earlier call that read it must be done first.
        if (current_scratch && scratch_recorded) MOE_CUDA_CHECK(cudaStreamWaitEvent(copy, scratch_free, 0));
        wait_seq = read_and_upload(pending.layer, pending.miss_ids, pending.cs);
      });
    }
    (pending.kind == CacheFill::kDemand ? refills_demand : refills_prefill) += pending.refills;
    tel.prefetch_refills += pending.refills;
    if (wait_seq > completed_seq) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute, batch_event(wait_seq), 0));
    std::vector<JobPtr> predicted = std::move(pending.predicted);
    pending.predicted.clear();
    for (const JobPtr& j : predicted) await_prediction(j);
  }

  void acquire(int layer, std::span<const int> ids, CacheFill kind, std::span<const uint8_t*> dev_out,
               int pf_layer = -1, std::span<const int> pf_ids = {}) {
    std::vector<uint8_t> ready(ids.size());
    begin_acquire(layer, ids, kind, dev_out, ready, pf_layer, pf_ids);
    finish_acquire();
  }

  // Between begin_acquire() and finish_acquire() the cache's state belongs to that acquire.
  void require_idle(const char* what) const {
    if (pending.active)
      throw ConfigError(std::string("gpu cache: ") + what +
                        " between begin_acquire and finish_acquire");
  }

  void prefetch(int layer, std::span<const int> ids) {
    require_idle("prefetch");
    check_layer(layer, "prefetch");
    require_worker();
    check_worker_error();
    poll();
    const std::vector<int> uniq = prediction_ids(ids);
    std::vector<std::pair<int, int>> placed;  // (expert, slot), pinned
    uint64_t again = 0;
    with_vram_retry([&] {
      placed.clear();
      again = 0;
      place_predictions(layer, uniq, placed, again);
    });
    requeued += again;
    queue_predictions(layer, placed);
  }

  GpuCacheTelemetry telemetry() const {
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
    {
      std::lock_guard<std::mutex> lk(mu);
      t.h2d_bytes += worker_h2d_bytes;
      t.h2d_copies += worker_h2d_copies;
      t.prefetch_h2d_bytes = worker_h2d_bytes;
    }
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

void GpuExpertCache::reset_telemetry() {
  impl_->tel = GpuCacheTelemetry{};
  impl_->refills_demand = impl_->refills_prefill = impl_->requeued = 0;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->worker_h2d_bytes = impl_->worker_h2d_copies = 0;
  }
  impl_->policy_base = CacheStats{};
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
  const int s = impl_->policy->slot_of({layer, expert});
  if (s < 0) return nullptr;
  const Impl::SlotMem& m = impl_->slot_mem[size_t(s)];
  if (!m.valid) return nullptr;  // a cancelled prediction: placed, never read
  if (m.job) {                   // a prediction: its bytes are there once its copy completed
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (m.job->state != Impl::JobState::kIssued || !Impl::done(m.job->done)) return nullptr;
  }
  return m.dev;
}

void GpuExpertCache::inject_alloc_failures(int n) { impl_->inject_failures = n; }

}  // namespace moestream
