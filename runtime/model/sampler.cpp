// Implementation of runtime/model/sampler.h. The uniform draw is built from the raw 64-bit output of
// mt19937_64 (fully specified by the standard), not from a distribution class whose algorithm
// varies between standard libraries.
#include "runtime/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/error.h"

namespace moestream {

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw ConfigError("--temp must be >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) throw ConfigError("--top-k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    throw ConfigError("--top-p must be in (0, 1], got " + std::to_string(p.top_p));
}

int Sampler::argmax(std::span<const float> logits) {
  MOE_ASSERT(!logits.empty());
  // A 151,936-entry vocabulary is read every token: the block maxima below vectorize (a compare
  // and select per lane, which keeps the lane's value on NaN), about 4x faster than
  // std::max_element's scalar loop. Then only the winning block is scanned for the first index.
  constexpr size_t kBlock = 1024, kLanes = 16;
  const float* p = logits.data();
  const size_t n = logits.size();
  float best = -INFINITY;
  size_t best_block = n;  // none yet: every value so far -inf or NaN
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    float lanes[kLanes];
    std::fill_n(lanes, kLanes, -INFINITY);
    size_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lanes[j] = p[i + j] > lanes[j] ? p[i + j] : lanes[j];
    float m = -INFINITY;
    for (size_t j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
    for (; i < e; ++i) m = p[i] > m ? p[i] : m;
    if (m > best) best = m, best_block = b;  // strictly: an earlier block keeps a tie
  }
  if (best_block == n) {  // no value above -inf: the first -inf, or 0 when all are NaN
    const float* f = std::find(p, p + n, -INFINITY);
    return f == p + n ? 0 : static_cast<int>(f - p);
  }
  size_t i = best_block;
  while (!(p[i] == best)) ++i;
  return static_cast<int>(i);
}

int Sampler::sample(std::span<const float> logits) {
  if (p_.temperature == 0) return argmax(logits);
  const int V = static_cast<int>(logits.size());
  // Descending logit, ascending id on ties: a total order, so the candidates are deterministic.
  const auto id_before = [&](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  const auto before = [&](const Candidate& a, const Candidate& b) { return id_before(a.id, b.id); };
  int n = V;
  if (p_.top_k > 0 && p_.top_k < V) {  // the k best ids, sorted (a heap of k over 4-byte ids)
    n = p_.top_k;
    ids_.resize(size_t(V));
    std::iota(ids_.begin(), ids_.end(), 0);
    std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), id_before);
    cand_.resize(size_t(n));
    for (int i = 0; i < n; ++i) cand_[size_t(i)].id = ids_[size_t(i)];
  } else {
    cand_.resize(size_t(V));
    for (int i = 0; i < V; ++i) cand_[size_t(i)].id = i;
  }
  // Weights relative to the largest logit, so every one is at most 1. No sort of the whole
  // vocabulary: at 151,936 ids std::sort took 17 ms a token, more than a decode step.
  const double top = logits[size_t(n < V ? cand_[0].id : argmax(logits))];
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    Candidate& c = cand_[size_t(i)];
    sum += c.p = static_cast<float>(std::exp((logits[size_t(c.id)] - top) / p_.temperature));
  }
  if (p_.top_p < 1) {
    n = nucleus_to_front(n, p_.top_p * sum, before);
    sum = 0;
    for (int i = 0; i < n; ++i) sum += cand_[size_t(i)].p;
  }
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double cum = 0;
  for (int i = 0; i < n; ++i) {
    cum += cand_[size_t(i)].p;
    if (u < cum) return cand_[size_t(i)].id;
  }
  return cand_[size_t(n - 1)].id;  // u rounding past the last bucket
}

// Weighted quickselect: the order's smallest prefix of cand_[0, n) whose weight reaches target,
// moved to the front in O(n) expected; its size is returned. cand_[0, lo) is known to be in it
// (weight `in`), and it ends in [lo, hi).
template <class Before>
int Sampler::nucleus_to_front(int n, double target, const Before& before) {
  int lo = 0, hi = n;
  double in = 0;
  while (hi - lo > 32) {
    const Candidate pivot = cand_[size_t(lo + (hi - lo) / 2)];
    auto first = cand_.begin() + lo, last = cand_.begin() + hi;
    auto mid = std::partition(first, last, [&](const Candidate& c) { return before(c, pivot); });
    std::iter_swap(mid, std::find_if(mid, last, [&](const Candidate& c) { return c.id == pivot.id; }));
    const int m = int(mid - cand_.begin());  // [lo, m) before the pivot, the pivot at m
    double w = 0;
    for (int i = lo; i < m; ++i) w += cand_[size_t(i)].p;
    if (in + w >= target) {
      hi = m;
    } else if (in + w + pivot.p >= target) {
      return m + 1;
    } else {
      in += w + pivot.p;
      lo = m + 1;
    }
  }
  std::sort(cand_.begin() + lo, cand_.begin() + hi, before);
  for (int i = lo; i < hi; ++i) {
    in += cand_[size_t(i)].p;
    if (in >= target) return i + 1;
  }
  return hi;
}

}  // namespace moestream
