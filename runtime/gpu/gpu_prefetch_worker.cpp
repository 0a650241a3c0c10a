// Implementation of runtime/gpu/gpu_prefetch_worker.h.
#include "runtime/gpu/gpu_prefetch_worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"

namespace moestream {

namespace {
// 64 MiB holds a look-ahead of 24 Qwen3-30B q4 experts in flight.
constexpr size_t kPrefetchStagingBytes = 64 * kGpuCacheMiB;
}  // namespace

GpuPrefetchWorker::GpuPrefetchWorker(ExpertStore& store, size_t entry_bytes, size_t staging_bytes,
                                     GpuEventPool& events, Release release)
    : store_(store), events_(events), release_(std::move(release)) {
  MOE_ASSERT(entry_bytes > 0, "prefetch staging entries of 0 bytes");
  MOE_CUDA_CHECK(cudaGetDevice(&device_));
  const size_t want = staging_bytes ? staging_bytes : kPrefetchStagingBytes;
  staging_.emplace(entry_bytes, std::clamp<size_t>(want / entry_bytes, 2, 1024));
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (...) {
    cudaStreamDestroy(stream_);
    throw;
  }
}

GpuPrefetchWorker::~GpuPrefetchWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    queue_.clear();
    for (const JobPtr& j : jobs_)
      if (j->state == JobState::kQueued || j->state == JobState::kReading)
        j->state = JobState::kCancelled;
  }
  cv_worker_.notify_all();
  thread_.join();  // it finishes the read in hand (an engine store writes into its buffers)
  cudaStreamSynchronize(stream_);
  for (const JobPtr& j : jobs_) cudaEventDestroy(j->done);
  jobs_.clear();
  staging_.reset();
  cudaStreamDestroy(stream_);
  cudaGetLastError();
}

// ---- worker thread ----------------------------------------------------------------------------
// One group (one prefetch() call) at a time, in order; each expert is copied as soon as its read
// lands, unless the host cancelled it meanwhile.
void GpuPrefetchWorker::loop() {
  cudaSetDevice(device_);
  std::vector<int> ids;
  for (;;) {
    std::vector<JobPtr> group;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_worker_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      group = std::move(queue_.front());
      queue_.pop_front();
      std::erase_if(group, [](const JobPtr& j) { return j->state != JobState::kQueued; });
      for (const JobPtr& j : group) j->state = JobState::kReading;
    }
    if (group.empty()) continue;
    ids.clear();
    for (const JobPtr& j : group) ids.push_back(j->expert);
    try {
      store_.begin_fetch(group[0]->layer, ids);
      size_t i = 0;
      ExpertMatrices m;
      while (store_.next_ready(&i, &m, true)) {
        MOE_ASSERT(i < group.size(), "store handed out an expert it was not asked for");
        Job& j = *group[i];
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (j.state != JobState::kReading) continue;  // cancelled: nothing to copy
          j.state = JobState::kCopying;
        }
        copy_prediction(j, m.payload);
        {
          std::lock_guard<std::mutex> lk(mu_);
          j.state = JobState::kIssued;
          counters_.h2d_bytes += j.bytes;
          ++counters_.h2d_copies;
        }
        cv_host_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
        for (const JobPtr& j : group)
          if (j->state == JobState::kReading || j->state == JobState::kCopying)
            j->state = JobState::kFailed;
      }
      cv_host_.notify_all();
    }
  }
}

// Stages one expert and copies it on the worker's stream; the job's event follows.
void GpuPrefetchWorker::copy_prediction(Job& j, const uint8_t* payload) {
  uint8_t* st = staging_->next();
  std::memcpy(st, payload, j.bytes);
  MOE_CUDA_CHECK(cudaMemcpyAsync(j.dst, st, j.bytes, cudaMemcpyHostToDevice, stream_));
  staging_->record(stream_);
  MOE_CUDA_CHECK(cudaEventRecord(j.done, stream_));
}

// ---- host thread ------------------------------------------------------------------------------
GpuPrefetchWorker::JobPtr GpuPrefetchWorker::make_job(int layer, int expert, int slot,
                                                      uint8_t* dst, size_t bytes) {
  MOE_ASSERT(bytes <= staging_->entry_bytes(), "prediction larger than a staging entry");
  return std::make_shared<Job>(Job{layer, expert, slot, dst, bytes, events_.take()});
}

void GpuPrefetchWorker::submit(std::vector<JobPtr> group) {
  if (group.empty()) return;
  jobs_.insert(jobs_.end(), group.begin(), group.end());
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(group));
  }
  cv_worker_.notify_one();
}

void GpuPrefetchWorker::release(Job& j) {
  release_(j);
  events_.give(j.done);
}

void GpuPrefetchWorker::poll() {
  if (jobs_.empty()) return;
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(jobs_, [&](const JobPtr& j) {
    if (j->state != JobState::kIssued || !gpu_event_done(j->done)) return false;
    release(*j);
    return true;
  });
}

void GpuPrefetchWorker::cancel_unasked(int layer, const std::vector<int>& asked,
                                       const std::function<void(Job&)>& on_cancel) {
  if (jobs_.empty()) return;
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(jobs_, [&](const JobPtr& j) {
    if (j->layer != layer || std::find(asked.begin(), asked.end(), j->expert) != asked.end())
      return false;
    if (j->state != JobState::kQueued && j->state != JobState::kReading) return false;
    j->state = JobState::kCancelled;
    on_cancel(*j);
    release(*j);
    return true;
  });
}

bool GpuPrefetchWorker::steal(Job& j) {
  std::lock_guard<std::mutex> lk(mu_);
  if (j.state != JobState::kQueued) return false;
  j.state = JobState::kCancelled;
  release(j);
  std::erase_if(jobs_, [&](const JobPtr& p) { return p.get() == &j; });
  return true;
}

bool GpuPrefetchWorker::issued(const Job& j) const {
  std::lock_guard<std::mutex> lk(mu_);
  return j.state == JobState::kIssued;
}

GpuPrefetchWorker::JobState GpuPrefetchWorker::wait_issued(const Job& j, uint64_t& waits,
                                                           double& wait_s) {
  std::unique_lock<std::mutex> lk(mu_);
  if (j.state != JobState::kIssued && j.state != JobState::kFailed) {
    ++waits;
    const auto t0 = std::chrono::steady_clock::now();
    cv_host_.wait(lk, [&] { return j.state == JobState::kIssued || j.state == JobState::kFailed; });
    wait_s += seconds_since(t0);
  }
  return j.state;
}

bool GpuPrefetchWorker::copied(const Job& j) const {
  std::lock_guard<std::mutex> lk(mu_);
  return j.state == JobState::kIssued && gpu_event_done(j.done);
}

void GpuPrefetchWorker::drain() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    for (const JobPtr& j : jobs_)
      if (j->state == JobState::kQueued || j->state == JobState::kReading)
        j->state = JobState::kCancelled;
    cv_host_.wait(lk, [&] {
      return std::none_of(jobs_.begin(), jobs_.end(),
                          [](const JobPtr& j) { return j->state == JobState::kCopying; });
    });
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const JobPtr& j : jobs_) events_.give(j->done);
  jobs_.clear();
}

std::exception_ptr GpuPrefetchWorker::take_error() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(error_, nullptr);
}

GpuPrefetchWorker::Counters GpuPrefetchWorker::counters() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}

void GpuPrefetchWorker::reset_counters() {
  std::lock_guard<std::mutex> lk(mu_);
  counters_ = Counters{};
}

}  // namespace moestream
