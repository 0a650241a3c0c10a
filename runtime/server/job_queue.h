// One engine, many clients: a bounded FIFO of jobs served one at a time by a worker thread.
// A full queue refuses at once (the caller answers 503); cancelled jobs are skipped.
#pragma once

#include <functional>

#include "runtime/server/waiting_jobs.h"

namespace moestream {

class JobQueue final : public QueuedRunner {
 public:
  // capacity: jobs that may wait behind the running one. run() is called on the worker thread
  // and must finish the job (Job::finish or Job::fail). dropped() (optional) is told of each job
  // cancelled while it waited, which the queue finishes as "cancelled" without running it.
  JobQueue(size_t capacity, std::function<void(Job&)> run, std::function<void(const Job&)> dropped = {});
  ~JobQueue() override { shutdown(); }

  bool running() const override;

 private:
  size_t free_slots() const override { return running_ ? 0 : 1; }
  void loop();

  std::function<void(Job&)> run_;
  bool running_ = false;  // under mu_
};

}  // namespace moestream
