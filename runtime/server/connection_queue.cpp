// Implementation of runtime/server/connection_queue.h: fixed worker threads over a bounded deque;
// overflow runs inline, flagged by a thread-local.
#include "runtime/server/connection_queue.h"

namespace moestream {

namespace {
thread_local bool t_overloaded = false;
}

ConnectionQueue::ConnectionQueue(size_t threads, size_t max_waiting) : max_waiting_(max_waiting) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

ConnectionQueue::~ConnectionQueue() { shutdown(); }

bool ConnectionQueue::overloaded() { return t_overloaded; }

void ConnectionQueue::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_.size() < max_waiting_ && !shutdown_) {
      waiting_.push_back(std::move(fn));
      cv_.notify_one();
      return;
    }
  }
  // Full: serve it here, flagged, so the routes answer 503 at once (the closure also closes the
  // socket; dropping it would leak the connection).
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
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void ConnectionQueue::worker() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // shutting down and drained (as httplib's ThreadPool)
      fn = std::move(waiting_.front());
      waiting_.pop_front();
    }
    fn();
  }
}

}  // namespace moestream
