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
  explicit ThreadPool(int n_threads = 0);  // ConfigError when the threads cannot start
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn() exactly once on every thread of the pool, the caller included (e.g. to size
  // per-thread scratch before the first timed step). Returns when all have run.
  template <class Fn>
  void on_each_thread(Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_on_each(+[](void* ctx) { (*static_cast<F*>(ctx))(); },
                const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Calls fn(i) for every i in [0, n_tasks), spread over the pool; returns when all are done.
  // The first exception thrown by fn is rethrown here after every task has finished.
  // Not reentrant: one parallel_for at a time per pool.
  template <class Fn>
  void parallel_for(size_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n_tasks, [](void* ctx, size_t i) { (*static_cast<F*>(ctx))(i); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, size_t);
  // Two job slots: a worker that wakes late may still read slot g%2 of its generation g while
  // job g+1 fills the other slot; job g+2 cannot start before job g's tasks are all done.
  struct Job {
    std::atomic<TaskFn> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<size_t> n_tasks{0};
  };
  void run(size_t n_tasks, TaskFn fn, void* ctx);
  void run_on_each(void (*fn)(void*), void* ctx);
  void worker_loop();
  void stop_and_join();
  void work_on(uint64_t generation);  // claims and runs tasks of that generation while any remain

  std::vector<std::thread> workers_;
  Job jobs_[2];
  std::atomic<uint64_t> generation_{0};
  // (generation << 32) | next task index: a claim succeeds only within its own generation.
  std::atomic<uint64_t> claim_{0};
  std::atomic<size_t> done_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace moestream
