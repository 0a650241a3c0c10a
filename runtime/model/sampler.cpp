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
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
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
