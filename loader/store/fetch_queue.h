// The engine store's I/O threads: fetches' read batches run in order on two threads (a
// read-ahead's batch beside the current one instead of queueing behind its tail) and look-aheads
// on a third of their own, started on the first guess. The engine reports each request as it
// lands and the worker that finished it computes its checksum there, so verification runs on the
// engine's threads in parallel and overlaps the reads still in flight (on one caller thread it
// took a third of O_DIRECT decode time: ~1 ms per 6.7 MB expert). The caller's thread takes the
// landed requests (next_landed) and judges them; nothing here throws for a failed read.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "loader/io/io_engine.h"
#include "loader/store/engine_fetch.h"

namespace moestream::engine_store {

class FetchQueue {
 public:
  explicit FetchQueue(IoEngine& engine);
  ~FetchQueue();  // drops guesses not started, waits for every batch in flight
  FetchQueue(const FetchQueue&) = delete;
  FetchQueue& operator=(const FetchQueue&) = delete;

  // Queues f's batch (f.reqs, not empty): a look-ahead on the look-ahead's thread.
  void submit(Fetch& f);
  // The next landed request of f, else of p (the look-ahead f awaits, may be null): true with
  // `mine` (it is f's) and its index. Without `wait`, false when none has landed; with it,
  // blocks (counted as io_wait_seconds) and returns false only when neither has one to come.
  bool next_landed(Fetch& f, Fetch* p, bool wait, bool* mine, size_t* r);
  // Waits until f's batch is done (not busy).
  void wait_done(Fetch& f);
  // Marks f retired and returns true when its batch is still busy.
  bool retire_if_busy(Fetch& f);
  bool busy(const Fetch& f) const;
  // A look-ahead whose batch no thread has taken yet is dropped from the queue (true).
  bool cancel_if_queued(Fetch& f);

  // What the threads counted, once every batch is done.
  struct Counters {
    double io_seconds = 0, checksum_seconds = 0, io_wait_seconds = 0;
    uint64_t lookahead_read = 0, lookahead_bytes = 0, lookahead_cancelled = 0;
  };
  Counters counters() const;
  // `caller`'s counts (the caller's thread's) with the threads' counters and then the engine's
  // read counts: the store's stats. Waits for every batch first, as counters() does.
  ExpertStoreStats with_counters(const ExpertStoreStats& caller) const;

 private:
  void io_loop(bool predictions);
  IoEngine& engine_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Fetch*> jobs_;
  std::deque<Fetch*> pred_jobs_;  // look-aheads, for pred_thread_ (started on the first one)
  size_t n_busy_ = 0;             // batches queued or in flight
  bool stop_ = false;
  Counters counters_;
  std::thread io_threads_[2];
  std::thread pred_thread_;
};

// The IoError for a read that did not return its bytes: file, offset, length, and the file's
// size at open (truncated) or strerror.
IoError read_error(const IoEngine& engine, const ReadRequest& q);

}  // namespace moestream::engine_store
