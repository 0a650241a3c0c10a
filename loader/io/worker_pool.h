// A small pool of persistent threads that run one function on N workers and wait for all of
// them: the read engine's submitters, so a per-layer batch does not pay for thread creation.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moestream::io {

class WorkerPool {
 public:
  // n_workers >= 1; worker 0 is the calling thread. ConfigError when the threads cannot start.
  explicit WorkerPool(unsigned n_workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  unsigned size() const { return n_workers_; }

  // Runs fn(w) for every w in [0, n_active) (n_active clamped to size()) and returns when all
  // are done. fn must not throw. Calls must not overlap.
  void run(unsigned n_active, const std::function<void(unsigned)>& fn);

 private:
  void loop(unsigned w);
  void stop_and_join();

  unsigned n_workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(unsigned)>* fn_ = nullptr;
  unsigned n_active_ = 0;
  unsigned pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace moestream::io
