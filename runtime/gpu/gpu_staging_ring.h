// Pinned host staging of the GPU expert cache: the buffers reads are copied into before a
// host-to-device copy, each reused only after the copy that read it has completed.
// - GpuStagingRing (demand): a byte ring; copies go out in numbered batches on one in-order copy
//   stream, so "batch N done" implies every earlier batch done, and one completed_seq() answers
//   whether a staging range (or a slot a batch wrote) is free.
// - GpuStagingEntries (prefetch worker): fixed entries of one expert each, one event per entry.
// Internal to runtime/gpu (needs the CUDA runtime).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "loader/store/expert_store.h"
#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_expert_cache.h"

namespace moestream {

// One expert to bring to the device.
struct GpuCopy {
  uint8_t* dst;
  const uint8_t* src;  // the store's payload
  size_t bytes;
  int slot;            // policy slot, -1 for scratch
  uint64_t seq = 0;    // set by GpuStagingRing::upload: the batch that copies it
  // Start of the device allocation dst lies in: device-adjacent copies merge only inside one
  // allocation (one copy may not span two cudaMalloc blocks, even when they happen to abut).
  // nullptr: never merged.
  const uint8_t* region = nullptr;
  // src lies in page-locked memory (GpuPinnedMappings): copied from there, not staged.
  bool direct = false;
};

// Where an expert's parts lie in its slot: the layout's offsets and each part's bytes. A store
// hands out either one payload laid out as the slot, or (a GGUF computed in place) the three
// matrices where they lie in the file's mapping: each then goes to its offset.
struct GpuExpertParts {
  ExpertLayout layout;
  size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0, bias_bytes = 0;
  static GpuExpertParts of(const ExpertLayout& lay, size_t hidden, size_t intermediate);
};

class GpuPinnedMappings;

class GpuStagingRing {
 public:
  // `bytes` of pinned staging (Error when the host cannot pin them); copies go on `copy`
  // (not owned); batch_copies: cudaMemcpyBatchAsync for several ranges where the runtime has it.
  GpuStagingRing(size_t bytes, cudaStream_t copy, GpuEventPool& events, bool batch_copies);
  ~GpuStagingRing();  // the caller has synchronized the copy stream
  GpuStagingRing(const GpuStagingRing&) = delete;
  GpuStagingRing& operator=(const GpuStagingRing&) = delete;

  // Stages and copies `cs` (sorted here by destination) in groups that fit half the ring, so one
  // group is staged while the previous one copies; device-adjacent experts go as one copy. Sets
  // each copy's seq, adds the copies issued and bytes to the counters, returns the last seq.
  uint64_t upload(std::vector<GpuCopy>& cs, uint64_t& h2d_copies, uint64_t& h2d_bytes);
  // Reads cs[i] = expert ids[i] of `layer` through `store` (host tiers first; the matrices
  // form, so page-cache pages verified earlier come as the mapping's own pages, never read into
  // a buffer) and uploads each as soon as it has landed: one next_ready() that waits,
  // plus every other expert ready by then, is one upload, so the copies of early experts overlap
  // the reads of late ones. Parts inside `pinned` (when set) are copied from there; the rest
  // are staged. on_copied(copy) follows each upload, for each of its copies (seq set; an expert
  // handed out as three matrices is three copies). Counts h2d_copies, h2d_bytes,
  // h2d_direct_bytes and demand_wait_s (host time in waiting) into `tel`. Returns the seq of the
  // last batch (0: nothing to copy).
  uint64_t read_and_upload(ExpertStore& store, int layer, const std::vector<int>& ids,
                           std::vector<GpuCopy>& cs, const GpuExpertParts& parts,
                           const GpuPinnedMappings* pinned, GpuCacheTelemetry& tel,
                           const std::function<void(const GpuCopy&)>& on_copied);

  // Retires completed batches without blocking (their staging is free).
  void poll();
  // Blocks the host until batch `seq` is done.
  void wait(uint64_t seq);
  // The event recorded after batch `seq`, which must still be in flight (seq > completed_seq()).
  cudaEvent_t event_of(uint64_t seq) const;
  // The copy stream is synchronized: every batch is done, the ring starts over (flush).
  void retire_all();

  uint64_t completed_seq() const { return completed_seq_; }
  uint64_t last_seq() const { return next_seq_; }  // the last batch issued (0: none)
  size_t bytes() const { return bytes_; }
  size_t n_in_flight() const { return batches_.size(); }

 private:
  struct Batch {
    uint64_t seq;
    cudaEvent_t done;
    size_t stage_begin, stage_end;  // staging bytes the copies read
  };
  size_t reserve(size_t n);
  void retire_front();
  void issue_runs(std::vector<void*>& dst, std::vector<const void*>& src, std::vector<size_t>& sizes);

  GpuEventPool& events_;
  cudaStream_t copy_;
  bool batch_copies_;
  uint8_t* staging_ = nullptr;
  size_t bytes_, head_ = 0;
  uint64_t next_seq_ = 0, completed_seq_ = 0;
  std::deque<Batch> batches_;
};

// Staging of the prefetch worker: `n` entries of `entry_bytes`, handed out round robin; an
// entry is reused only after the copy that last read it has completed. Worker thread only.
class GpuStagingEntries {
 public:
  GpuStagingEntries(size_t entry_bytes, size_t n);  // Error when the host cannot pin them
  ~GpuStagingEntries();  // the caller has synchronized the stream the copies went on
  GpuStagingEntries(const GpuStagingEntries&) = delete;
  GpuStagingEntries& operator=(const GpuStagingEntries&) = delete;

  // The next entry, once the copy that last read it has completed (host wait).
  uint8_t* next();
  // Records, on `stream`, that the copy reading the entry next() returned has been issued.
  void record(cudaStream_t stream);
  size_t n() const { return done_.size(); }
  size_t entry_bytes() const { return entry_bytes_; }

 private:
  uint8_t* staging_ = nullptr;
  size_t entry_bytes_;
  std::vector<cudaEvent_t> done_;
  std::vector<uint8_t> used_;
  size_t next_ = 0, current_ = 0;
};

}  // namespace moestream
