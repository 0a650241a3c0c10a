// Bounded admission for cpp-httplib: a fixed pool of HTTP threads plus a bounded FIFO of accepted
// connections; a connection beyond both is served inline on the accept thread in "overloaded" mode.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moestream {

// httplib::Server::new_task_queue hands each accepted connection to TaskQueue::enqueue as an
// opaque closure (the socket is not visible), so excess connections cannot simply be dropped
// without leaking the socket. Instead the overflow closure runs at once on the caller (httplib's
// accept thread) with overloaded() true: the routes answer 503 + Retry-After without touching the
// engine, and the connection is closed. While that runs, further connections wait in the
// kernel's listen backlog, so memory and waiting clients stay bounded end to end.
class ConnectionQueue : public httplib::TaskQueue {
 public:
  // threads: connections served at once; max_waiting: accepted connections that may wait for a
  // thread.
  ConnectionQueue(size_t threads, size_t max_waiting);
  ~ConnectionQueue() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  // True on a thread that is serving an overflow connection.
  static bool overloaded();

 private:
  void worker();

  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> waiting_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moestream
