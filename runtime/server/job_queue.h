// One engine, many clients: a bounded FIFO of jobs served one at a time by a worker thread.
// A full queue refuses at once (the caller answers 503); cancelled jobs are skipped.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/server/job.h"
#include "runtime/server/job_runner.h"
#include "runtime/server/waiting_jobs.h"

namespace moestream {

class JobQueue final : public JobRunner {
 public:
  // capacity: jobs that may wait behind the running one. run() is called on the worker thread
  // and must finish the job (Job::finish or Job::fail). dropped() (optional) is told of each job
  // cancelled while it waited, which the queue finishes as "cancelled" without running it.
  JobQueue(size_t capacity, std::function<void(Job&)> run, std::function<void(const Job&)> dropped = {});
  ~JobQueue() override;  // shutdown()

  // False when the queue is full or shutting down.
  bool submit(std::shared_ptr<Job> job) override;
  // The job's client left: a waiting job leaves the queue now (finished "cancelled", reported to
  // dropped()); a running one is marked and stops after its current token.
  void cancel(const std::shared_ptr<Job>& job) override;
  size_t waiting() const override;
  bool running() const override;
  size_t capacity() const override { return capacity_; }
  // Refuses new jobs, fails the waiting ones with 503, lets the running one finish, joins.
  void shutdown() override;

 private:
  void loop();

  const size_t capacity_;
  std::function<void(Job&)> run_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  WaitingJobs jobs_;  // under mu_
  bool running_ = false, stopping_ = false;
  std::thread worker_;
};

}  // namespace moestream
