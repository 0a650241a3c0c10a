// A fixed pool of worker threads for the forward pass: parallel_for over task indices, with the
// calling thread taking part. Built for many short parallel sections per token (no allocation).
// Posted tasks (post / run_posted) fill the gaps between sections: long work that must be done
// before some later point (the expert store's first-use hashes) without a barrier of its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
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

  // Queues `task` to run once on a worker with nothing of a parallel_for left to claim (between
  // sections, or at a section's end, where it would otherwise wait: it never delays a claimed
  // task), or in run_posted. The caller's thread runs posted tasks only in run_posted. A task
  // must not call parallel_for on this pool. Allocates (the queue and the task).
  void post(std::function<void()> task);
  // Runs every task posted so far that no worker has started, over the whole pool, and returns
  // once every posted task has finished (those running on workers included). The first
  // exception a posted task threw since the last call is rethrown here. Not from inside a task.
  void run_posted();

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
  // Posted tasks: queued under posted_mu_; posted_queued_ mirrors the queue's size so that a
  // worker looks without the lock; posted_open_ counts those queued or running.
  bool run_one_posted();  // takes and runs one queued task; false when none was queued
  std::mutex posted_mu_;
  std::deque<std::function<void()>> posted_;
  std::atomic<size_t> posted_queued_{0};
  std::atomic<size_t> posted_open_{0};
  std::exception_ptr posted_error_;
};

}  // namespace moestream
