// Implementation of loader/store/checksum_trust.h.
#include "loader/store/checksum_trust.h"

#include <chrono>

#include "common/timing.h"
#include "loader/format/expert_file.h"

namespace moestream::engine_store {

void ChecksumTrust::track(Layer& L) {
  if (verify_ && L.checksummed() && L.pieces.size() == 1 && L.pieces[0].page_cache != nullptr)
    L.verified = verified_.add_layer(L.path, uint32_t(L.header.slot_checksums.size()));
}

ChecksumTrust::LayerTrust ChecksumTrust::begin(const Layer& L) {
  LayerTrust t;
  t.due = verify_ && L.checksummed();
  t.tracked = t.due && L.verified >= 0;
  t.trusted = L.verified >= 0 && verified_.refresh(L.verified);
  return t;
}

ChecksumTrust::InPlace ChecksumTrust::in_place(const Layer& L, LayerTrust t, uint32_t slot, bool resident) {
  if (!t.due) return InPlace::kYes;
  if (!resident) {
    if (t.tracked) verified_.forget(L.verified, slot);
    return InPlace::kNo;
  }
  if (!t.trusted) return InPlace::kNo;
  return verified_.holds(L.verified, slot) ? InPlace::kYes : InPlace::kFirstUse;
}

bool ChecksumTrust::read_needs_hash(const Layer& L, LayerTrust t, uint32_t slot, bool resident) {
  if (!t.due) return false;
  if (!t.tracked) return true;
  if (!resident) {  // pages gone: the read comes from the device
    verified_.forget(L.verified, slot);
    return true;
  }
  return !(t.trusted && verified_.holds(L.verified, slot));
}

void ChecksumTrust::passed(const Layer& L, uint32_t slot) {
  if (L.verified >= 0) verified_.mark(L.verified, slot);
}

void ChecksumTrust::check_first_uses(const Layer& L, std::span<const uint32_t> slots, std::span<ExpertMatrices> ms,
                                     std::vector<uint8_t>& ok, ExpertStoreStats& stats) {
  const size_t n = slots.size();
  ok.assign(n, 0);
  if (n == 0) return;
  const auto payload = [&](size_t i) { return ms[i].gate - L.layout.gate_offset; };
  if (post_) {  // computed now, checked by settle() before the caller returns a result
    for (size_t i = 0; i < n; ++i) {
      ms[i].unverified = pending_.find(L.index, slots[i]);
      if (ms[i].unverified == nullptr)
        ms[i].unverified = pending_.add(L.index, slots[i], L.header.payload_hash, payload(i), L.layout.bytes,
                                        verified_.epoch(L.verified), post_);
      ok[i] = 1;
    }
    return;
  }
  std::vector<uint64_t> got(n, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto hash = [&](size_t i) { got[i] = expert_checksum(L.header.payload_hash, payload(i), L.layout.bytes); };
  if (parallel_for_ && n > 1) {
    parallel_for_(n, hash);
  } else {
    for (size_t i = 0; i < n; ++i) hash(i);
  }
  stats.checksum_seconds += seconds_since(t0);
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != L.header.slot_checksums[slots[i]]) continue;
    verified_.mark(L.verified, slots[i]);
    ok[i] = 1;
    ++stats.verified_in_place;
  }
}

void ChecksumTrust::settle(const std::vector<Layer>& layers, ExpertStoreStats& stats) {
  const auto settled = pending_.settle();
  for (const auto& e : settled) stats.checksum_seconds += e->seconds;
  const PendingChecks::Entry* bad = nullptr;
  for (const auto& e : settled) {
    const Layer& L = layers[size_t(e->layer)];
    if (e->got != L.header.slot_checksums[e->slot]) {
      if (bad == nullptr) bad = e.get();
      continue;
    }
    // Its file changed since the hash was queued: those bytes passed, but the pages may not be
    // the same now, so the expert is not marked (its next use is hashed again).
    if (verified_.refresh(L.verified) && verified_.epoch(L.verified) == e->epoch) verified_.mark(L.verified, e->slot);
    ++stats.verified_in_place;
  }
  if (bad != nullptr) throw expert_checksum_error(layers[size_t(bad->layer)], bad->slot, bad->bytes, bad->got);
}

}  // namespace moestream::engine_store
