// Implementation of runtime/thread_pool.h: workers spin briefly on a generation counter (sections
// follow each other within microseconds during decode), then sleep on it with atomic wait.
#include "runtime/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOE_CPU_RELAX() _mm_pause()
#else
#define MOE_CPU_RELAX() ((void)0)
#endif

namespace moestream {

namespace {
// ~50 us of spinning on current x86: long enough to bridge the serial gap between two parallel
// sections of one layer, short enough not to burn a core between tokens.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
  for (;;) {
    size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_tasks_) return;
    try {
      fn_(ctx_, i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      MOE_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load()) return;
    drain();
    acked_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(size_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks == 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (size_t i = 0; i < n_tasks; ++i) fn(ctx, i);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  error_ = nullptr;
  acked_.store(0, std::memory_order_relaxed);
  next_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  drain();
  // Every worker must have left drain() before the job's fields may be reused: a straggler
  // holding a stale index would otherwise run a task of the next job twice.
  while (acked_.load(std::memory_order_acquire) < workers_.size()) MOE_CPU_RELAX();
  if (error_) std::rethrow_exception(error_);
}

}  // namespace moestream
