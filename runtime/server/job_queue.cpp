// Implementation of runtime/server/job_queue.h.
#include "runtime/server/job_queue.h"

namespace moestream {

JobQueue::JobQueue(size_t capacity, std::function<void(Job&)> run, std::function<void(const Job&)> dropped)
    : capacity_(capacity), run_(std::move(run)), jobs_(std::move(dropped)), worker_([this] { loop(); }) {}

JobQueue::~JobQueue() { shutdown(); }

bool JobQueue::submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_ || !jobs_.push(std::move(job), capacity_ + (running_ ? 0 : 1))) return false;
  cv_.notify_all();
  return true;
}

void JobQueue::cancel(const std::shared_ptr<Job>& job) {
  job->cancel();
  std::lock_guard<std::mutex> lk(mu_);
  jobs_.remove(job);
}

size_t JobQueue::waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  return jobs_.live();
}

bool JobQueue::running() const {
  std::lock_guard<std::mutex> lk(mu_);
  return running_;
}

void JobQueue::shutdown() {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    dropped = jobs_.take_all();
    cv_.notify_all();
  }
  WaitingJobs::fail_all(dropped);
  if (worker_.joinable()) worker_.join();
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
