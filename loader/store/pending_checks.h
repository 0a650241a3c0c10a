// First uses whose hash runs beside their compute (issue 19; ExpertStore::set_deferred_checks):
// the engine store hands a resident, never verified expert out in place at once and queues its
// checksum on the lender's threads, which take it between the caller's parallel sections; the
// caller's verify_pending() then waits for every hash and compares. Each hash is held by a shared
// entry, so a queued task that outlives the store finds it cancelled instead of reading the
// store's unmapped pages; the store's destructor cancels what has not started and waits for what
// has. Caller's thread only, except the queued hashes themselves.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/error.h"
#include "loader/format/expert_file.h"

namespace moestream {

class PendingChecks {
 public:
  using Post = std::function<void(std::function<void()>)>;
  struct Entry {
    int layer = 0;
    uint32_t slot = 0;
    PayloadHash hash = PayloadHash::kXxh3;  // its file's slot checksum
    const uint8_t* data = nullptr;  // the payload in the mapping
    uint64_t bytes = 0;
    uint64_t epoch = 0;   // VerifiedPages::epoch of its file when queued
    uint64_t got = 0;     // its checksum, once done
    double seconds = 0;   // the hash's time
    std::atomic<int> state{kQueued};
    bool done() const { return state.load(std::memory_order_acquire) == kDone; }
  };

  PendingChecks() = default;
  ~PendingChecks();
  PendingChecks(const PendingChecks&) = delete;
  PendingChecks& operator=(const PendingChecks&) = delete;

  // Queues the hash of `bytes` at `data` (expert `slot` of `layer`, its file at `epoch`, whose
  // checksums are `hash`) through `post` (never null). The entry lives until settle().
  Entry* add(int layer, uint32_t slot, PayloadHash hash, const uint8_t* data, uint64_t bytes, uint64_t epoch,
             const Post& post);
  bool empty() const { return entries_.empty(); }
  // The entry queued for expert `slot` of `layer`, or null.
  Entry* find(int layer, uint32_t slot) const;
  // Runs e's hash on the calling thread unless a thread has started it (then returns at once):
  // the thread about to compute a first use hashes it first, so its compute finds the payload in
  // the cache the hash just read it through, instead of the hash reading it from memory again
  // later. Any thread, while e lives.
  static void run_now(Entry& e) { run(e); }
  // Waits for every queued hash (running here those no thread has started) and returns the
  // entries, all done, in the order they were added; none is pending afterwards.
  std::vector<std::shared_ptr<Entry>> settle();
  // The caller's pass failed (a read of it threw): nothing computed from its first uses will be
  // returned, and a hash one of them took may be of pages the failure's cause changed (a file
  // truncated under it). Those not started are cancelled; none is returned by find() or settle()
  // again, and each lives until the next settle() (which waits out a hash still running), as a
  // handed-out entry must.
  void abandon();
  // Runs step(); when it throws (a read of the pass failed), abandon() and rethrow.
  template <class Step>
  void abandon_if_throws(Step&& step) {
    try {
      step();
    } catch (const Error&) {
      abandon();
      throw;
    }
  }

 private:
  static constexpr int kQueued = 0, kRunning = 1, kDone = 2, kCancelled = 3;
  static void run(Entry& e);  // queued -> running -> done; nothing when another thread took it
  static void wait_done(Entry& e);
  static void cancel_or_wait(Entry& e);  // queued -> cancelled, else waits out a running hash
  std::vector<std::shared_ptr<Entry>> entries_;
  std::vector<std::shared_ptr<Entry>> abandoned_;
};

}  // namespace moestream
