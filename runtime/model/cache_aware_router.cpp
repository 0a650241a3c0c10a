// Implementation of runtime/model/cache_aware_router.h: the per-chunk cache-aware step of both
// passes over the substitution rules of routing.h. Plain loops: k <= 8 and n_experts <= a few
// hundred per (token, layer).
#include "runtime/model/cache_aware_router.h"

#include <algorithm>

#include "common/error.h"

namespace moestream {

CacheAwareStats& CacheAwareStats::operator+=(const CacheAwareStats& o) {
  routings += o.routings;
  slots += o.slots;
  slots_unchanged += o.slots_unchanged;
  substitutions += o.substitutions;
  layer_chunks += o.layer_chunks;
  misses_before += o.misses_before;
  misses_after += o.misses_after;
  return *this;
}

CacheAwareRouter::CacheAwareRouter(int n_experts, int top_k, bool normalize)
    : E_(n_experts), K_(top_k), normalize_(normalize), probs_(size_t(n_experts)),
      exact_ids_(size_t(top_k)), seen_before_(size_t(n_experts)), seen_after_(size_t(n_experts)),
      resident_union_(size_t(n_experts)) {
  MOE_ASSERT(top_k > 0 && top_k <= n_experts);
}

void CacheAwareRouter::set_grouped(const RouterParams& p) {
  MOE_ASSERT(p.n_experts == E_ && p.k == K_ && grouped_cache_aware(p));
  grouped_ = true;
  params_ = p;
  grouped_scratch_.assign(p.scratch_floats(), 0.0f);
}

int CacheAwareRouter::apply(std::span<const uint8_t> resident, const float* logits, int T,
                            float tolerance, int* ids_all, float* weights, CacheAwareStats& st,
                            const float* bias, std::span<const int> union_splits) {
  MOE_ASSERT(resident.size() == size_t(E_), "resident must hold n_experts flags");
  const bool use_union = union_splits.size() > 2;
  MOE_ASSERT(union_splits.empty() || (union_splits.size() >= 2 && union_splits.front() == 0 && union_splits.back() == T),
             "union_splits must run from 0 to T");
  std::fill(seen_before_.begin(), seen_before_.end(), 0);
  std::fill(seen_after_.begin(), seen_after_.end(), 0);
  if (use_union) std::copy(resident.begin(), resident.end(), resident_union_.begin());
  ++st.layer_chunks;
  int total = 0;
  size_t seq = 0;  // the sequence of row t (union_splits)
  for (int t = 0; t < T; ++t) {
    while (use_union && t == union_splits[seq + 1]) {
      // A new sequence: the earlier one's final choices are read this step, so count as resident.
      for (int r = union_splits[seq]; r < t; ++r)
        for (int j = 0; j < K_; ++j) resident_union_[size_t(ids_all[size_t(r) * K_ + size_t(j)])] = 1;
      ++seq;
    }
    const std::span<const uint8_t> res = use_union ? std::span<const uint8_t>(resident_union_) : resident;
    int* ids = ids_all + size_t(t) * K_;
    const float* row = logits + size_t(t) * E_;
    std::copy(ids, ids + K_, exact_ids_.begin());
    const int changed = grouped_ ? substitute_resident_grouped(params_, row, bias, res, tolerance, ids, grouped_scratch_)
                                 : substitute_resident(row, E_, K_, res, tolerance, ids);
    if (changed > 0 && grouped_)
      grouped_routing_weights(params_, row, ids, weights + size_t(t) * K_, grouped_scratch_);
    else if (changed > 0)
      routing_weights(row, E_, ids, K_, normalize_, weights + size_t(t) * K_, probs_.data());
    total += changed;
    st.routings += 1;
    st.slots += uint64_t(K_);
    st.substitutions += uint64_t(changed);
    st.slots_unchanged += uint64_t(K_ - changed);
    for (int j = 0; j < K_; ++j) {
      const size_t b = size_t(exact_ids_[size_t(j)]), a = size_t(ids[j]);
      if (!resident[b] && !seen_before_[b]) ++st.misses_before;
      if (!resident[a] && !seen_after_[a]) ++st.misses_after;
      seen_before_[b] = seen_after_[a] = 1;
    }
  }
  return total;
}

}  // namespace moestream
