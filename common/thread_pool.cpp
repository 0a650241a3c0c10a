// Implementation of common/thread_pool.h. Threads spin briefly (sections follow each other
// within microseconds during decode), then sleep on an atomic wait, so an oversubscribed machine
// (parallel test runs, other processes) does not lose whole time slices to spinning.
#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOE_CPU_RELAX() _mm_pause()
#else
#define MOE_CPU_RELAX() ((void)0)
#endif

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

namespace {

// 30 us bridges the serial gap between two parallel sections of one layer; longer spinning
// only steals the core from whoever else needs it.
constexpr auto kSpin = std::chrono::microseconds(30);

// Spins until pred() or kSpin has passed; returns pred().
template <class Pred>
bool spin_until(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      MOE_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() > deadline) return pred();
  }
}

constexpr uint64_t kIndexMask = 0xffffffffull;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  try {
    workers_.reserve(static_cast<size_t>(n_threads - 1));
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {  // std::system_error (no more threads) or bad_alloc
    // No destructor for a constructor that throws: join the started threads here (a joinable
    // std::thread destroyed would terminate the process).
    stop_and_join();
    throw ConfigError("cannot start " + std::to_string(n_threads - 1) + " worker threads (" + e.what() +
                      "); ask for fewer (" + option_ref("threads") + ")");
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::work_on(uint64_t g) {
  const uint64_t tag = (g & kIndexMask) << 32;
  const Job& job = jobs_[g & 1];
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    if ((c & ~kIndexMask) != tag) return;  // a newer job: this one is fully claimed
    const size_t i = c & kIndexMask;
    // n_tasks may be torn by job g+2 only after job g completed, in which case the CAS fails.
    if (i >= job.n_tasks.load(std::memory_order_relaxed)) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    // Claimed: job g cannot complete (nor its slot be reused) until this task is counted done.
    try {
      job.fn.load(std::memory_order_relaxed)(job.ctx.load(std::memory_order_relaxed), i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.n_tasks.load(std::memory_order_relaxed))
      done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // A new section first; a posted task only when every task of the last one is claimed. A
    // sleeping worker is not woken for posted tasks: the next section or run_posted finds them.
    const auto news = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until([&] { return news() || posted_queued_.load(std::memory_order_acquire) > 0; })) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    if (!news()) {
      run_one_posted();
      continue;
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    work_on(seen);
  }
}

void ThreadPool::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(posted_mu_);
  posted_.push_back(std::move(task));
  posted_open_.fetch_add(1, std::memory_order_acq_rel);
  posted_queued_.fetch_add(1, std::memory_order_release);
}

bool ThreadPool::run_one_posted() {
  std::function<void()> task;
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    if (posted_.empty()) return false;
    task = std::move(posted_.front());
    posted_.pop_front();
    posted_queued_.fetch_sub(1, std::memory_order_release);
  }
  try {
    task();
  } catch (...) {
    std::lock_guard<std::mutex> lock(posted_mu_);
    if (!posted_error_) posted_error_ = std::current_exception();
  }
  if (posted_open_.fetch_sub(1, std::memory_order_acq_rel) == 1) posted_open_.notify_all();
  return true;
}

void ThreadPool::run_posted() {
  // One pool task per queued task: each takes whichever is next (workers may take some first).
  parallel_for(posted_queued_.load(std::memory_order_acquire), [this](size_t) { run_one_posted(); });
  // Then those that workers started before: wait for them.
  if (!spin_until([&] { return posted_open_.load(std::memory_order_acquire) == 0; }))
    for (size_t n = posted_open_.load(std::memory_order_acquire); n != 0;
         n = posted_open_.load(std::memory_order_acquire))
      posted_open_.wait(n, std::memory_order_acquire);
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    e = std::exchange(posted_error_, nullptr);
  }
  if (e) std::rethrow_exception(e);
}

void ThreadPool::run(size_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks == 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (size_t i = 0; i < n_tasks; ++i) fn(ctx, i);
    return;
  }
  const uint64_t g = generation_.load(std::memory_order_relaxed) + 1;
  Job& job = jobs_[g & 1];
  job.fn.store(fn, std::memory_order_relaxed);
  job.ctx.store(ctx, std::memory_order_relaxed);
  job.n_tasks.store(n_tasks, std::memory_order_relaxed);
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  claim_.store((g & kIndexMask) << 32, std::memory_order_release);
  generation_.store(g, std::memory_order_release);
  generation_.notify_all();
  work_on(g);
  if (!spin_until([&] { return done_.load(std::memory_order_acquire) == n_tasks; })) {
    for (size_t d = done_.load(std::memory_order_acquire); d != n_tasks;
         d = done_.load(std::memory_order_acquire))
      done_.wait(d, std::memory_order_acquire);
  }
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::run_on_each(void (*fn)(void*), void* ctx) {
  // size() tasks, none of which finishes before all have started: a thread claims its next task
  // only after finishing the last, so each thread runs exactly one.
  struct Barrier {
    void (*fn)(void*);
    void* ctx;
    std::atomic<size_t> started{0};
    size_t n;
  } b{fn, ctx, {}, size_t(size())};
  parallel_for(b.n, [&b](size_t) {
    b.fn(b.ctx);
    b.started.fetch_add(1, std::memory_order_acq_rel);
    for (size_t s = b.started.load(std::memory_order_acquire); s != b.n;
         s = b.started.load(std::memory_order_acquire))
      b.started.wait(s, std::memory_order_acquire);
    b.started.notify_all();
  });
}

}  // namespace moestream
