// Implementation of runtime/model/sampler.h. The uniform draw is built from the raw 64-bit output of
// mt19937_64 (fully specified by the standard), not from a distribution class whose algorithm
// varies between standard libraries.
#include "runtime/model/sampler.h"

#include <algorithm>
#include <cmath>
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
  order_.resize(size_t(V));
  for (int i = 0; i < V; ++i) order_[size_t(i)] = i;
  // Descending logit, ascending id on ties: a total order, so the candidate list is deterministic.
  auto by_logit = [&](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  int n = V;
  if (p_.top_k > 0 && p_.top_k < V) {
    n = p_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  probs_.resize(size_t(n));
  const double top = logits[size_t(order_[0])];
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum += probs_[size_t(i)] = static_cast<float>(std::exp((logits[size_t(order_[size_t(i)])] - top) / p_.temperature));
  // Nucleus: the smallest prefix whose probability reaches top_p.
  if (p_.top_p < 1) {
    double cum = 0;
    for (int i = 0; i < n; ++i) {
      cum += probs_[size_t(i)] / sum;
      if (cum >= p_.top_p) {
        n = i + 1;
        break;
      }
    }
    sum = 0;
    for (int i = 0; i < n; ++i) sum += probs_[size_t(i)];
  }
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double cum = 0;
  for (int i = 0; i < n; ++i) {
    cum += probs_[size_t(i)];
    if (u < cum) return order_[size_t(i)];
  }
  return order_[size_t(n - 1)];  // u rounding past the last bucket
}

}  // namespace moestream
