// Implementation of loader/store/pending_checks.h.
#include "loader/store/pending_checks.h"

#include <chrono>
#include <utility>

#include "common/timing.h"
#include "loader/format/expert_file.h"

namespace moestream {

PendingChecks::~PendingChecks() {
  for (const auto& e : entries_) cancel_or_wait(*e);
  for (const auto& e : abandoned_) cancel_or_wait(*e);
}

void PendingChecks::cancel_or_wait(Entry& e) {
  int s = kQueued;
  if (!e.state.compare_exchange_strong(s, kCancelled, std::memory_order_acq_rel) && s != kCancelled) wait_done(e);
}

void PendingChecks::abandon() {
  for (auto& e : entries_) {
    int s = kQueued;
    e->state.compare_exchange_strong(s, kCancelled, std::memory_order_acq_rel);
    abandoned_.push_back(std::move(e));
  }
  entries_.clear();
}

void PendingChecks::run(Entry& e) {
  int s = kQueued;
  if (!e.state.compare_exchange_strong(s, kRunning, std::memory_order_acq_rel)) return;
  const auto t0 = std::chrono::steady_clock::now();
  e.got = expert_checksum(e.hash, e.data, e.bytes);
  e.seconds = seconds_since(t0);
  e.state.store(kDone, std::memory_order_release);
  e.state.notify_all();
}

void PendingChecks::wait_done(Entry& e) {
  for (int s = e.state.load(std::memory_order_acquire); s != kDone;
       s = e.state.load(std::memory_order_acquire))
    e.state.wait(s, std::memory_order_acquire);
}

PendingChecks::Entry* PendingChecks::add(int layer, uint32_t slot, PayloadHash hash, const uint8_t* data,
                                         uint64_t bytes, uint64_t epoch, const Post& post) {
  auto e = std::make_shared<Entry>();
  e->layer = layer;
  e->slot = slot;
  e->hash = hash;
  e->data = data;
  e->bytes = bytes;
  e->epoch = epoch;
  entries_.push_back(e);
  post([e] { run(*e); });
  return e.get();
}

PendingChecks::Entry* PendingChecks::find(int layer, uint32_t slot) const {
  for (const auto& e : entries_)
    if (e->layer == layer && e->slot == slot) return e.get();
  return nullptr;
}

std::vector<std::shared_ptr<PendingChecks::Entry>> PendingChecks::settle() {
  for (const auto& e : abandoned_) cancel_or_wait(*e);
  abandoned_.clear();
  for (const auto& e : entries_) {
    run(*e);  // not started yet: hashed here
    wait_done(*e);
  }
  return std::exchange(entries_, {});
}

}  // namespace moestream
