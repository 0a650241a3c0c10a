// A fixed pool of worker threads for the forward pass: parallel_for over task indices, with the
// calling thread taking part. Built for many short parallel sections per token (no allocation).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace moestream {

class ThreadPool {
 public:
  // n_threads counts the caller: n_threads - 1 workers are started. 0 means all cores.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n_tasks), spread over the pool; returns when all are done.
  // The first exception thrown by fn is rethrown here after every task has finished.
  template <class Fn>
  void parallel_for(size_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n_tasks, [](void* ctx, size_t i) { (*static_cast<F*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, size_t);
  void run(size_t n_tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void drain();  // takes tasks of the current job until none is left

  std::vector<std::thread> workers_;
  // The current job; published by bumping generation_.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_tasks_ = 0;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> acked_{0};  // workers done with the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace moestream
