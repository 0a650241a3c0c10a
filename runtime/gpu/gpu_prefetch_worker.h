// The GPU expert cache's look-ahead thread: reads predicted experts through its own store,
// stages them in its own pinned entries and copies them on its own stream, so a demand copy
// never queues behind a prediction. The host thread owns the policy and slot memory: it places
// and pins a predicted slot and hands the worker a Job; the job's state (under the worker's
// lock) says how far it got, and the host releases the slot once the job's copy has completed
// (or it was cancelled). Internal to runtime/gpu (needs the CUDA runtime).
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "loader/store/expert_store.h"
#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_staging_ring.h"

namespace moestream {

class GpuPrefetchWorker {
 public:
  // kQueued/kReading: cancellable (the worker copies nothing); kCopying: the worker is issuing
  // the copy; kIssued: `done` is recorded after it; kFailed: its group's read threw.
  enum class JobState { kQueued, kReading, kCopying, kIssued, kCancelled, kFailed };
  struct Job {
    int layer, expert, slot;
    uint8_t* dst;
    size_t bytes;
    cudaEvent_t done;
    JobState state = JobState::kQueued;  // guarded by the worker's lock
  };
  using JobPtr = std::shared_ptr<Job>;
  // Host thread, under the worker's lock: the job no longer holds its slot (unpin it). The
  // job's event goes back to the pool right after.
  using Release = std::function<void(Job&)>;

  // Reads through `store` (not owned, outlives the worker; used by the worker thread only).
  // Staging: `staging_bytes` (0: 64 MiB) in entries of `entry_bytes`, at least 2, at most 1024.
  GpuPrefetchWorker(ExpertStore& store, size_t entry_bytes, size_t staging_bytes,
                    GpuEventPool& events, Release release);
  // Cancels what is not being read, finishes the read in hand (a store writes into its own
  // buffers), joins, and waits for the copies issued.
  ~GpuPrefetchWorker();
  GpuPrefetchWorker(const GpuPrefetchWorker&) = delete;
  GpuPrefetchWorker& operator=(const GpuPrefetchWorker&) = delete;

  // ---- host thread ----
  // A job for `bytes` of (layer, expert) into `dst`, the pinned slot `slot`.
  JobPtr make_job(int layer, int expert, int slot, uint8_t* dst, size_t bytes);
  // One group (one prefetch() of the cache): read with one begin_fetch, in submission order.
  void submit(std::vector<JobPtr> group);
  // Releases the jobs whose copy has completed.
  void poll();
  // Cancels the jobs of `layer` whose expert is not in `asked` and that are not yet being
  // copied; on_cancel(job) runs for each (under the lock), then the job is released.
  void cancel_unasked(int layer, const std::vector<int>& asked,
                      const std::function<void(Job&)>& on_cancel);
  // Takes back a job the worker has not begun reading (released; the caller reads it): true.
  bool steal(Job& j);
  bool issued(const Job& j) const;
  // Blocks until the job's copy is issued or its read failed; returns that state. A wait
  // counts in `waits` and its host time in `wait_s`.
  JobState wait_issued(const Job& j, uint64_t& waits, double& wait_s);
  // The job's bytes are in place: copy issued and completed.
  bool copied(const Job& j) const;
  // No job is being copied and none will be; the stream is synchronized, every job dropped
  // without a release (flush: the caller starts its policy afresh).
  void drain();
  // The first read error since the last call (nullptr: none).
  std::exception_ptr take_error();
  size_t n_jobs() const { return jobs_.size(); }

  struct Counters {
    uint64_t h2d_bytes = 0, h2d_copies = 0;  // copies issued by the worker
  };
  Counters counters() const;  // one consistent reading
  void reset_counters();

 private:
  void loop();
  void copy_prediction(Job& j, const uint8_t* payload);
  void release(Job& j);  // under mu_

  ExpertStore& store_;
  GpuEventPool& events_;
  Release release_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::optional<GpuStagingEntries> staging_;  // worker thread only

  std::vector<JobPtr> jobs_;  // host thread only: the jobs whose slot pin is held
  mutable std::mutex mu_;
  std::condition_variable cv_worker_, cv_host_;
  std::deque<std::vector<JobPtr>> queue_;  // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
  std::exception_ptr error_;               // guarded by mu_
  Counters counters_;                      // guarded by mu_
  std::thread thread_;
};

}  // namespace moestream
