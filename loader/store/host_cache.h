// The engine's own host expert cache for O_DIRECT reads (where the page cache is bypassed):
// one 4 KiB aligned arena cut into equal slots, one expert per slot, LfuPolicy eviction. Experts
// are keyed by (layer, logical id), as in the GPU cache. A slot filled for a read holds good bytes
// only once that read and its checksum passed (proved): until then no hit hands it out, and a
// fetch that releases it unproved (failed read, bad checksum, abandoned) forgets its key, so a
// failed read never leaves bytes a later fetch can reuse.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "loader/store/lfu_policy.h"

namespace moestream {

class HostCache {
 public:
  // slot_bytes is rounded up to 4 KiB; the slot count is budget_bytes / that (0 slots is a
  // valid, always-missing cache). Throws IoError when the memory cannot be allocated.
  HostCache(uint64_t budget_bytes, uint64_t slot_bytes);
  ~HostCache();
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  uint32_t n_slots() const { return policy_.n_slots(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot_data(uint32_t slot) const { return arena_ + uint64_t(slot) * slot_bytes_; }
  LfuPolicy& policy() { return policy_; }
  const LfuPolicy& policy() const { return policy_; }

  // A demand use of `key`: its slot, pinned, when it holds proved bytes; -1 on a miss; kLoading
  // when its slot is still being filled by another fetch (read it again rather than hand out
  // bytes that may not have landed).
  static constexpr int64_t kLoading = -2;
  int64_t take_hit(ExpertKey key);
  // A slot, pinned and not proved, for a read of `key`'s bytes; -1 when admission refuses (the
  // read goes to a scratch buffer).
  int64_t fill(ExpertKey key, CacheFill kind);
  void proved(int64_t slot) { proved_[size_t(slot)] = 1; }
  // A fetch is done with `key`'s `slot`: forgotten unless its bytes proved good, then unpinned.
  void release(ExpertKey key, int64_t slot);
  bool holds(ExpertKey key) const { return policy_.slot_of(key) >= 0; }
  // A demand use of an expert whose bytes came another way (a look-ahead's read): heats `key`.
  void heat(ExpertKey key) { (void)policy_.lookup(key, CacheFill::kDemand); }

 private:
  std::vector<uint8_t> proved_;  // per slot: the bytes passed their read and checksum
  uint64_t slot_bytes_ = 0;
  uint8_t* arena_ = nullptr;
  LfuPolicy policy_;
};

}  // namespace moestream
