// Implementation of runtime/server/job_queue.h.
#include "runtime/server/job_queue.h"

namespace moestream {

JobQueue::JobQueue(size_t capacity, std::function<void(Job&)> run, std::function<void(const Job&)> dropped)
    : capacity_(capacity), run_(std::move(run)), dropped_(std::move(dropped)), worker_([this] { loop(); }) {}

void JobQueue::drop(Job& job) {
  job.finish(JobResult{"cancelled"});
  if (dropped_) dropped_(job);
}

JobQueue::~JobQueue() { shutdown(); }

bool JobQueue::submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return false;
  // Jobs whose client already left still hold a place until the worker pops them; drop them
  // here so that a disconnect frees its slot at once.
  std::erase_if(jobs_, [this](const std::shared_ptr<Job>& j) {
    if (!j->cancelled()) return false;
    drop(*j);
    return true;
  });
  if (jobs_.size() >= capacity_ + (running_ ? 0 : 1)) return false;
  jobs_.push_back(std::move(job));
  cv_.notify_all();
  return true;
}

void JobQueue::cancel(const std::shared_ptr<Job>& job) {
  job->cancel();
  std::lock_guard<std::mutex> lk(mu_);
  if (std::erase(jobs_, job) > 0) drop(*job);
}

size_t JobQueue::waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& j : jobs_) n += !j->cancelled();
  return n;
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
    dropped.swap(jobs_);
    cv_.notify_all();
  }
  for (auto& j : dropped) j->fail(ApiError(503, "shutting_down", "the server is shutting down"));
  if (worker_.joinable()) worker_.join();
}

void JobQueue::loop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping
      job = jobs_.front();
      jobs_.pop_front();
      if (job->cancelled()) {
        drop(*job);
        continue;
      }
      running_ = true;
    }
    run_(*job);
    std::lock_guard<std::mutex> lk(mu_);
    running_ = false;
  }
}

}  // namespace moestream
