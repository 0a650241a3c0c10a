// Implementation of runtime/server/job_queue.h.
#include "runtime/server/job_queue.h"

namespace moestream {

JobQueue::JobQueue(size_t capacity, std::function<void(Job&)> run, std::function<void(const Job&)> dropped)
    : QueuedRunner(capacity, std::move(dropped)), run_(std::move(run)) {
  start_worker([this] { loop(); });
}

bool JobQueue::running() const {
  std::lock_guard<std::mutex> lk(mu_);
  return running_;
}

void JobQueue::loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      job = jobs_.pop();
      if (!job) {
        if (stopping_) return;
        continue;  // only cancelled ones waited
      }
      running_ = true;
    }
    run_(*job);
    std::lock_guard<std::mutex> lk(mu_);
    running_ = false;
  }
}

}  // namespace moestream
