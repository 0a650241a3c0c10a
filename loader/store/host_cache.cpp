// Implementation of loader/store/host_cache.h: the arena is allocated once, up front, so the budget is
// what the process holds from the start (no growth surprises mid-run).
#include "loader/store/host_cache.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "common/error.h"

namespace moestream {
namespace {
constexpr uint64_t kAlign = 4096;  // O_DIRECT buffer alignment
uint64_t round_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

HostCache::HostCache(uint64_t budget_bytes, uint64_t slot_bytes)
    : slot_bytes_(round_up(std::max<uint64_t>(slot_bytes, 1))),
      policy_(uint32_t(std::min<uint64_t>(budget_bytes / slot_bytes_, UINT32_MAX))) {
  proved_.assign(policy_.n_slots(), 0);
  const uint64_t bytes = uint64_t(policy_.n_slots()) * slot_bytes_;
  if (bytes == 0) return;
  void* p = nullptr;
  if (::posix_memalign(&p, kAlign, bytes) != 0)
    throw std::bad_alloc();  // open_store_for names the size and the option that asked for it
  arena_ = static_cast<uint8_t*>(p);
}

HostCache::~HostCache() { std::free(arena_); }

int64_t HostCache::take_hit(ExpertKey key) {
  const int cs = policy_.lookup(key, CacheFill::kDemand);
  if (cs < 0) return -1;
  if (!proved_[size_t(cs)]) return kLoading;
  policy_.pin(cs);
  return cs;
}

int64_t HostCache::fill(ExpertKey key, CacheFill kind) {
  const CacheAccess a = policy_.insert(key, kind);
  if (a.outcome != CacheOutcome::kFilled) return -1;
  policy_.pin(a.slot);
  proved_[size_t(a.slot)] = 0;
  return a.slot;
}

void HostCache::release(ExpertKey key, int64_t slot) {
  if (!proved_[size_t(slot)]) policy_.erase(key);
  policy_.unpin(int(slot));
}

}  // namespace moestream
