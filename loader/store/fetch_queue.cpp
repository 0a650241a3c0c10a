// Implementation of loader/store/fetch_queue.h.
#include "loader/store/fetch_queue.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/timing.h"
#include "loader/format/expert_file.h"

namespace moestream::engine_store {

FetchQueue::FetchQueue(IoEngine& engine) : engine_(engine) {
  for (std::thread& t : io_threads_) t = std::thread([this] { io_loop(false); });
}

FetchQueue::~FetchQueue() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (Fetch* f : pred_jobs_) f->busy = false;  // guesses not started: nobody takes them now
    n_busy_ -= pred_jobs_.size();
    pred_jobs_.clear();
    cv_.wait(lock, [&] { return n_busy_ == 0; });  // a batch in flight writes into its buffers
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : io_threads_) t.join();
  if (pred_thread_.joinable()) pred_thread_.join();
}

void FetchQueue::submit(Fetch& f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    f.landed.clear();
    f.landed_head = 0;
    f.busy = true;
    f.submitted = false;
    ++n_busy_;
    (f.prediction ? pred_jobs_ : jobs_).push_back(&f);
  }
  if (f.prediction && !pred_thread_.joinable()) pred_thread_ = std::thread([this] { io_loop(true); });
  cv_.notify_all();
}

bool FetchQueue::next_landed(Fetch& f, Fetch* p, bool wait, bool* mine, size_t* r) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto any = [&] {
    return f.landed_head < f.landed.size() || (p != nullptr && p->landed_head < p->landed.size());
  };
  if (!any()) {
    if (!wait) return false;
    auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, any);
    counters_.io_wait_seconds += seconds_since(t0);
  }
  *mine = f.landed_head < f.landed.size();
  *r = *mine ? f.landed[f.landed_head++] : p->landed[p->landed_head++];
  return true;
}

void FetchQueue::wait_done(Fetch& f) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !f.busy; });
}

bool FetchQueue::retire_if_busy(Fetch& f) {
  std::lock_guard<std::mutex> lock(mu_);
  if (f.busy) f.retired = true;
  return f.busy;
}

bool FetchQueue::busy(const Fetch& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  return f.busy;
}

bool FetchQueue::cancel_if_queued(Fetch& f) {
  std::lock_guard<std::mutex> lock(mu_);
  auto q = std::find(pred_jobs_.begin(), pred_jobs_.end(), &f);
  if (q == pred_jobs_.end()) return false;
  pred_jobs_.erase(q);
  f.busy = false;
  --n_busy_;
  counters_.lookahead_cancelled += f.items.size();
  return true;
}

FetchQueue::Counters FetchQueue::counters() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return n_busy_ == 0; });
  return counters_;
}

ExpertStoreStats FetchQueue::with_counters(const ExpertStoreStats& caller) const {
  const Counters c = counters();
  const IoEngineStats engine = engine_.stats();  // after the batches: every read counted
  ExpertStoreStats s = caller;
  s.io_seconds += c.io_seconds;
  s.checksum_seconds += c.checksum_seconds;
  s.io_wait_seconds += c.io_wait_seconds;
  s.lookahead_read += c.lookahead_read;
  s.lookahead_cancelled += c.lookahead_cancelled;
  s.experts_read += c.lookahead_read;
  s.bytes_read += c.lookahead_bytes;
  s.read_ops_requested = engine.requests;
  s.read_ops_issued = engine.reads_issued;
  s.bytes_transferred = engine.bytes_read;
  return s;
}

IoError read_error(const IoEngine& engine, const ReadRequest& q) {
  const std::string where =
      engine.file_path(q.file) + " at offset " + std::to_string(q.offset) + " length " + std::to_string(q.length);
  if (q.result == ReadResult::kTruncated)
    return IoError("truncated file: read of " + where + " hit end of file (file has " +
                   std::to_string(engine.file_size(q.file)) + " bytes at open)");
  return IoError("read of " + where + " failed: " + std::strerror(q.error));
}

// Runs queued batches in order; the look-ahead's thread (predictions) takes only look-aheads,
// on the engine's third lane.
void FetchQueue::io_loop(bool predictions) {
  std::deque<Fetch*>& jobs = predictions ? pred_jobs_ : jobs_;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !jobs.empty() || stop_; });
    if (jobs.empty()) return;
    Fetch& f = *jobs.front();
    jobs.pop_front();
    f.submitted = true;
    if (f.prediction) {  // added to experts_read and bytes_read by the store's stats()
      counters_.lookahead_read += f.items.size();
      counters_.lookahead_bytes += f.items.size() * f.payload_bytes;
    }
    lock.unlock();
    auto t0 = std::chrono::steady_clock::now();
    // Two pointers fit std::function's inline buffer: no allocation per batch.
    Fetch* fp = &f;
    engine_.submit(f.reqs, [this, fp](const ReadRequest& r, size_t index) {
      Fetch& f = *fp;
      double dt = 0;
      if (f.due[index] && r.result == ReadResult::kOk) {
        auto c0 = std::chrono::steady_clock::now();
        f.checksum[index] = expert_checksum(f.hash, static_cast<const uint8_t*>(r.dest), f.payload_bytes);
        dt = seconds_since(c0);
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        f.landed.push_back(index);
        counters_.checksum_seconds += dt;
      }
      cv_.notify_all();
    });
    const double dt = seconds_since(t0);
    lock.lock();
    counters_.io_seconds += dt;
    f.busy = false;
    --n_busy_;
    cv_.notify_all();
  }
}

}  // namespace moestream::engine_store
