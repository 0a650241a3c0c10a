// The jobs waiting for a runner (JobQueue, BatchScheduler): one FIFO with the same rules for
// both. A cancelled waiter leaves at once, finished "cancelled" and told to on_dropped; a full
// queue refuses (the caller answers 503); shutdown fails every waiter with a 503.
// Not thread-safe: each runner calls it under the lock that also guards its running state.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>

#include "runtime/server/job.h"

namespace moestream {

class WaitingJobs {
 public:
  explicit WaitingJobs(std::function<void(const Job&)> on_dropped = {}) : on_dropped_(std::move(on_dropped)) {}

  // Queues `job` unless `room` jobs already wait (cancelled ones leave first, so a client that
  // disconnected frees its place at once). room: the runner's capacity plus its free slots.
  bool push(std::shared_ptr<Job> job, size_t room);
  // The job's client left while it waited: it leaves now. False when it was not waiting.
  bool remove(const std::shared_ptr<Job>& job);
  // The next job whose client is still there (cancelled ones are dropped on the way), or null.
  std::shared_ptr<Job> pop();
  bool empty() const { return jobs_.empty(); }
  size_t live() const;  // waiting jobs not cancelled
  // Shutting down: every waiter, to fail_all() once the runner's lock is released.
  std::deque<std::shared_ptr<Job>> take_all();
  static void fail_all(std::deque<std::shared_ptr<Job>>& jobs);

 private:
  void drop(Job& job);
  std::function<void(const Job&)> on_dropped_;
  std::deque<std::shared_ptr<Job>> jobs_;
};

}  // namespace moestream
