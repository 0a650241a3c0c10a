// The engine's own host expert cache for O_DIRECT reads (where the page cache is bypassed):
// one 4 KiB aligned arena cut into equal slots, one expert per slot, LfuPolicy eviction. Experts
// are keyed by (layer, logical id), as in the GPU cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

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

 private:
  uint64_t slot_bytes_ = 0;
  uint8_t* arena_ = nullptr;
  LfuPolicy policy_;
};

}  // namespace moestream
