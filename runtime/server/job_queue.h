// One engine, many clients: a bounded FIFO of jobs served one at a time by a worker thread.
// A full queue refuses at once (the caller answers 503); cancelled jobs are skipped.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/server/job.h"

namespace moestream {

class JobQueue {
 public:
  // capacity: jobs that may wait behind the running one. run() is called on the worker thread
  // and must finish the job (Job::finish or Job::fail).
  JobQueue(size_t capacity, std::function<void(Job&)> run);
  ~JobQueue();  // shutdown()

  // False when the queue is full or shutting down.
  bool submit(std::shared_ptr<Job> job);
  size_t waiting() const;
  bool running() const;
  size_t capacity() const { return capacity_; }
  // Refuses new jobs, fails the waiting ones with 503, lets the running one finish, joins.
  void shutdown();

 private:
  void loop();

  const size_t capacity_;
  std::function<void(Job&)> run_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool running_ = false, stopping_ = false;
  std::thread worker_;
};

}  // namespace moestream
