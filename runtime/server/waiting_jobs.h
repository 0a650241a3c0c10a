// The jobs waiting for a runner (JobQueue, BatchScheduler): one FIFO with the same rules for
// both. A cancelled waiter leaves at once, finished "cancelled" and told to on_dropped; a full
// queue refuses (the caller answers 503); shutdown fails every waiter with a 503. QueuedRunner
// is the JobRunner both derive from: submit, cancel, waiting and shutdown written once.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/server/job.h"
#include "runtime/server/job_runner.h"

namespace moestream {

// Not thread-safe: QueuedRunner calls it under the lock that also guards the runner's state.
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

// A runner whose jobs wait in one WaitingJobs for its worker thread.
class QueuedRunner : public JobRunner {
 public:
  ~QueuedRunner() override;  // shutdown(): a derived runner calls it first, while its state lives

  // False when room() jobs already wait or the runner is shutting down.
  bool submit(std::shared_ptr<Job> job) final;
  // The job's client left: a waiting job leaves now (finished "cancelled"); a running one is
  // marked and stops after its current token.
  void cancel(const std::shared_ptr<Job>& job) final;
  size_t waiting() const final;
  size_t capacity() const final { return capacity_; }
  // Refuses new jobs, fails the waiting ones with 503, lets the running ones finish, joins.
  void shutdown() final;

 protected:
  // capacity: jobs that may wait while every slot runs; on_dropped: told of each job cancelled
  // while it waited.
  QueuedRunner(size_t capacity, std::function<void(const Job&)> on_dropped);
  // Slots not running a job now (under mu_): that many more may wait.
  virtual size_t free_slots() const = 0;
  // The worker, started by the derived constructor once its state is built.
  void start_worker(std::function<void()> loop) { worker_ = std::thread(std::move(loop)); }

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a job arrived, or stopping_
  WaitingJobs jobs_;            // under mu_
  bool stopping_ = false;       // under mu_

 private:
  std::thread worker_;
};

}  // namespace moestream
