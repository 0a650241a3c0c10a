// Bounded admission for cpp-httplib: a fixed pool of HTTP threads plus a bounded FIFO of accepted
// connections; a connection beyond both is answered by a small pool of "overloaded" threads (503),
// and only beyond that pool's own FIFO inline on the accept thread.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moestream {

// httplib::Server::new_task_queue hands each accepted connection to TaskQueue::enqueue as an
// opaque closure (the socket is not visible), so excess connections cannot simply be dropped
// without leaking the socket. Instead an overflow closure runs with overloaded() true: the routes
// read the request (so that closing the socket does not reset it) and answer 503 + Retry-After
// without touching the engine, and the connection is closed. Overflow closures run on their own
// few threads, so a client that sends its request slowly (up to httplib's 5 s read timeout) holds
// one of those, not the accept thread; only when they and their FIFO are full too does one run on
// the accept thread, and further connections wait in the kernel's listen backlog. Memory and
// waiting clients stay bounded end to end.
class ConnectionQueue : public httplib::TaskQueue {
 public:
  // threads: connections served at once; max_waiting: accepted connections that may wait for a
  // thread; overflow_threads / max_overflow_waiting: the same for connections answered 503.
  ConnectionQueue(size_t threads, size_t max_waiting, size_t overflow_threads = 8,
                  size_t max_overflow_waiting = 256);
  ~ConnectionQueue() override;

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  // True on a thread that is serving an overflow connection.
  static bool overloaded();

 private:
  void worker(std::deque<std::function<void()>>& fifo, bool overflow);

  const size_t max_waiting_, max_overflow_waiting_, overflow_threads_;
  std::mutex mu_;
  std::condition_variable cv_, overflow_cv_;
  std::deque<std::function<void()>> waiting_, overflow_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moestream
