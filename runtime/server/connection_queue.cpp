// Implementation of runtime/server/connection_queue.h: fixed worker threads over a bounded deque,
// a few overflow threads over a second one; overflow is flagged by a thread-local.
#include "runtime/server/connection_queue.h"

#include <exception>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

namespace {
thread_local bool t_overloaded = false;
}

ConnectionQueue::ConnectionQueue(size_t threads, size_t max_waiting, size_t overflow_threads,
                                 size_t max_overflow_waiting)
    : max_waiting_(max_waiting), max_overflow_waiting_(max_overflow_waiting), overflow_threads_(overflow_threads) {
  if (threads == 0) threads = 1;
  try {
    threads_.reserve(threads + overflow_threads);
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(waiting_, false); });
    for (size_t i = 0; i < overflow_threads; ++i) threads_.emplace_back([this] { worker(overflow_, true); });
  } catch (const std::exception& e) {  // std::system_error (no more threads) or bad_alloc
    shutdown();  // no destructor for a throwing constructor: join what started
    throw ConfigError("cannot start " + std::to_string(threads + overflow_threads) + " HTTP threads (" +
                      e.what() + "); ask for fewer (" + option_ref("http_threads") + ")");
  }
}

ConnectionQueue::~ConnectionQueue() { shutdown(); }

bool ConnectionQueue::overloaded() { return t_overloaded; }

void ConnectionQueue::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutdown_ && waiting_.size() < max_waiting_) {
      waiting_.push_back(std::move(fn));
      cv_.notify_one();
      return;
    }
    if (!shutdown_ && overflow_threads_ > 0 && overflow_.size() < max_overflow_waiting_) {
      overflow_.push_back(std::move(fn));
      overflow_cv_.notify_one();
      return;
    }
  }
  // Everything full: serve it here, flagged (the closure also closes the socket; dropping it
  // would leak the connection).
  t_overloaded = true;
  try {
    fn();
  } catch (...) {
  }
  t_overloaded = false;
}

void ConnectionQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
  }
  cv_.notify_all();
  overflow_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void ConnectionQueue::worker(std::deque<std::function<void()>>& fifo, bool overflow) {
  t_overloaded = overflow;
  std::condition_variable& cv = overflow ? overflow_cv_ : cv_;
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv.wait(lock, [&] { return shutdown_ || !fifo.empty(); });
      if (fifo.empty()) return;  // shutting down and drained (as httplib's ThreadPool)
      fn = std::move(fifo.front());
      fifo.pop_front();
    }
    try {
      fn();
    } catch (...) {  // as the inline path: one connection's failure must not end the thread
    }
  }
}

}  // namespace moestream
