// Implementation of the read engine's persistent worker pool (generation-counted start signal).
#include "loader/io/worker_pool.h"

#include <algorithm>
#include <exception>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream::io {

WorkerPool::WorkerPool(unsigned n_workers) : n_workers_(std::max(1u, n_workers)) {
  try {
    threads_.reserve(n_workers_ - 1);
    for (unsigned w = 1; w < n_workers_; ++w) threads_.emplace_back([this, w] { loop(w); });
  } catch (const std::exception& e) {  // std::system_error (no more threads) or bad_alloc
    // The destructor does not run for a constructor that throws: stop the threads started so
    // far here (destroying joinable threads would terminate, and a condition variable with
    // waiters would block its destruction).
    stop_and_join();
    throw ConfigError("the read engine: cannot start " + std::to_string(n_workers_ - 1) +
                      " worker threads (" + e.what() + "); ask for fewer (" + option_ref("io_rings") + ", " + option_ref("io_threads") + ")");
  }
}

WorkerPool::~WorkerPool() { stop_and_join(); }

void WorkerPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void WorkerPool::run(unsigned n_active, const std::function<void(unsigned)>& fn) {
  n_active = std::clamp(n_active, 1u, n_workers_);
  if (n_active > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    MOE_ASSERT(pending_ == 0, "WorkerPool::run calls overlap");
    fn_ = &fn;
    n_active_ = n_active;
    pending_ = n_active - 1;
    ++generation_;
  }
  if (n_active > 1) start_cv_.notify_all();
  fn(0);
  if (n_active > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }
}

void WorkerPool::loop(unsigned w) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(unsigned)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (w >= n_active_) continue;  // not needed for this round
      fn = fn_;
    }
    (*fn)(w);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace moestream::io
