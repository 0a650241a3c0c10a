// Implementation of runtime/server/waiting_jobs.h.
#include "runtime/server/waiting_jobs.h"

#include <algorithm>

namespace moestream {

void WaitingJobs::drop(Job& job) {
  job.finish(JobResult{"cancelled"});
  if (on_dropped_) on_dropped_(job);
}

bool WaitingJobs::push(std::shared_ptr<Job> job, size_t room) {
  std::erase_if(jobs_, [this](const std::shared_ptr<Job>& j) {
    if (!j->cancelled()) return false;
    drop(*j);
    return true;
  });
  if (jobs_.size() >= room) return false;
  jobs_.push_back(std::move(job));
  return true;
}

bool WaitingJobs::remove(const std::shared_ptr<Job>& job) {
  if (std::erase(jobs_, job) == 0) return false;
  drop(*job);
  return true;
}

std::shared_ptr<Job> WaitingJobs::pop() {
  while (!jobs_.empty()) {
    std::shared_ptr<Job> j = std::move(jobs_.front());
    jobs_.pop_front();
    if (!j->cancelled()) return j;
    drop(*j);
  }
  return nullptr;
}

size_t WaitingJobs::live() const {
  return size_t(std::count_if(jobs_.begin(), jobs_.end(), [](const std::shared_ptr<Job>& j) { return !j->cancelled(); }));
}

std::deque<std::shared_ptr<Job>> WaitingJobs::take_all() { return std::exchange(jobs_, {}); }

void WaitingJobs::fail_all(std::deque<std::shared_ptr<Job>>& jobs) {
  for (auto& j : jobs) j->fail(ApiError(503, "shutting_down", "the server is shutting down"));
  jobs.clear();
}

QueuedRunner::QueuedRunner(size_t capacity, std::function<void(const Job&)> on_dropped)
    : capacity_(capacity), jobs_(std::move(on_dropped)) {}

QueuedRunner::~QueuedRunner() { shutdown(); }

bool QueuedRunner::submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_ || !jobs_.push(std::move(job), capacity_ + free_slots())) return false;
  cv_.notify_all();
  return true;
}

void QueuedRunner::cancel(const std::shared_ptr<Job>& job) {
  job->cancel();
  std::lock_guard<std::mutex> lk(mu_);
  jobs_.remove(job);
}

size_t QueuedRunner::waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  return jobs_.live();
}

void QueuedRunner::shutdown() {
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

}  // namespace moestream
