// What the HTTP API needs of the engine side: jobs in, cancellation, queue figures, shutdown.
// JobQueue (one request at a time) and BatchScheduler (--parallel N) implement it.
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/server/job.h"

namespace moestream {

class JobRunner {
 public:
  virtual ~JobRunner() = default;
  // False when the queue is full or shutting down.
  virtual bool submit(std::shared_ptr<Job> job) = 0;
  // The job's client left: a waiting job leaves at once (finished "cancelled"); a running one
  // is marked and stops after its current token.
  virtual void cancel(const std::shared_ptr<Job>& job) = 0;
  virtual size_t waiting() const = 0;
  virtual bool running() const = 0;
  virtual size_t capacity() const = 0;
  // Requests generating now: the running batch's size (BatchScheduler), else 0 or 1.
  virtual size_t running_count() const { return running() ? 1 : 0; }
  // Refuses new jobs, fails the waiting ones with 503, lets the running ones finish, joins.
  virtual void shutdown() = 0;
};

}  // namespace moestream
