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

namespace {
// Descending logit, ascending id on ties: a total order (without NaN), so choices are deterministic.
auto logit_before(std::span<const float> logits) {
  return [logits](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
}
// No finite logit is left: logit_bias banned them all, or the model gave none (NaN, -inf).
[[noreturn]] void throw_nothing_to_sample(bool biased) {
  if (biased) throw ConfigError("logit_bias bans every token of the vocabulary: nothing is left to sample");
  throw Error("the model's logits hold no finite value (NaN or -inf): nothing to sample");
}
}  // namespace

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw ConfigError("--temp must be >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) throw ConfigError("--top-k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    throw ConfigError("--top-p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    throw ConfigError("--min-p must be in [0, 1], got " + std::to_string(p.min_p));
  if (!(p.typical_p > 0 && p.typical_p <= 1))
    throw ConfigError("--typical-p must be in (0, 1], got " + std::to_string(p.typical_p));
  if (!(p.repeat_penalty > 0) || !std::isfinite(p.repeat_penalty))
    throw ConfigError("--repeat-penalty must be > 0, got " + std::to_string(p.repeat_penalty));
  if (p.repeat_last_n < -1)
    throw ConfigError("--repeat-last-n must be >= -1, got " + std::to_string(p.repeat_last_n));
  if (!std::isfinite(p.presence_penalty))
    throw ConfigError("--presence-penalty must be finite, got " + std::to_string(p.presence_penalty));
  if (!std::isfinite(p.frequency_penalty))
    throw ConfigError("--frequency-penalty must be finite, got " + std::to_string(p.frequency_penalty));
  for (const LogitBias& b : p.logit_bias)
    if (b.id < 0 || !(b.bias >= kLogitBan && b.bias <= -kLogitBan))
      throw ConfigError("--logit-bias " + std::to_string(b.id) + ":" + std::to_string(b.bias) +
                        ": the id must be >= 0 and the bias in [-100, 100]");
}

void Sampler::add_prompt(std::span<const int> prompt) {
  if (p_.repeat_penalty == 1 || p_.repeat_last_n == 0) return;
  const size_t keep = p_.repeat_last_n < 0 ? prompt.size() : std::min(prompt.size(), size_t(p_.repeat_last_n));
  for (int id : prompt.subspan(prompt.size() - keep)) remember(id, false);
}

// The repeat window slides by one token; the output counts only grow.
void Sampler::remember(int id, bool output) {
  if (output && (p_.presence_penalty != 0 || p_.frequency_penalty != 0)) ++generated_[id];
  if (p_.repeat_penalty == 1 || p_.repeat_last_n == 0) return;
  window_.push_back(id);
  ++in_window_[id];
  if (p_.repeat_last_n > 0 && window_.size() > size_t(p_.repeat_last_n)) {
    const auto it = in_window_.find(window_.front());
    if (--it->second == 0) in_window_.erase(it);
    window_.pop_front();
  }
}

std::span<const float> Sampler::adjusted(std::span<const float> logits) {
  if (!changes_logits()) return logits;
  adjusted_.assign(logits.begin(), logits.end());
  float* l = adjusted_.data();
  const int V = int(logits.size());
  for (const LogitBias& b : p_.logit_bias) {
    if (b.id >= V)
      throw ConfigError("logit_bias: token id " + std::to_string(b.id) + " is outside the vocabulary of " +
                        std::to_string(V));
    l[b.id] = b.bias == kLogitBan ? -INFINITY : l[b.id] + b.bias;
  }
  // Each distinct token once, whatever the order of the map: the result does not depend on it.
  for (const auto& [id, n] : in_window_)
    if (id < V) l[id] = l[id] > 0 ? l[id] / p_.repeat_penalty : l[id] * p_.repeat_penalty;
  for (const auto& [id, n] : generated_)
    if (id < V) l[id] -= p_.frequency_penalty * float(n) + p_.presence_penalty;
  return adjusted_;
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

int Sampler::sample(std::span<const float> raw) {
  const int id = draw(raw);
  remember(id, true);
  return id;
}

void Sampler::record(int id) { remember(id, true); }

int Sampler::draw(std::span<const float> raw) {
  const std::span<const float> logits = adjusted(raw);
  if (p_.temperature == 0) {
    const int id = argmax(logits);
    if (!(logits[size_t(id)] > -INFINITY)) throw_nothing_to_sample(!p_.logit_bias.empty());
    return id;
  }
  const int V = static_cast<int>(logits.size());
  const auto id_before = logit_before(logits);
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
  if (!(top > -INFINITY)) throw_nothing_to_sample(!p_.logit_bias.empty());
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    Candidate& c = cand_[size_t(i)];
    sum += c.p = static_cast<float>(std::exp((logits[size_t(c.id)] - top) / p_.temperature));
  }
  const auto mass = [&] {
    sum = 0;
    for (int i = 0; i < n; ++i) sum += cand_[size_t(i)].p;
  };
  if (p_.top_p < 1) {
    n = nucleus_to_front(n, p_.top_p * sum, before);
    mass();
  }
  if (p_.min_p > 0) {
    n = min_p_to_front(n);
    mass();
  }
  if (p_.typical_p < 1) {
    n = typical_to_front(n, sum);
    mass();
  }
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double cum = 0;
  int id = cand_[size_t(n - 1)].id;  // u rounding past the last bucket
  for (int i = 0; i < n; ++i) {
    cum += cand_[size_t(i)].p;
    if (u < cum) {
      id = cand_[size_t(i)].id;
      break;
    }
  }
  return id;
}

// min_p: the candidates whose weight is at least min_p x the largest, moved to the front.
int Sampler::min_p_to_front(int n) {
  float largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, cand_[size_t(i)].p);
  const float floor = p_.min_p * largest;
  const auto end = std::partition(cand_.begin(), cand_.begin() + n, [&](const Candidate& c) { return c.p >= floor; });
  return int(end - cand_.begin());
}

// typical_p: in order of |-log p - H| (p normalised over the n candidates, H their entropy), the
// smallest prefix holding typical_p of the mass, moved to the front.
int Sampler::typical_to_front(int n, double sum) {
  const double log_sum = std::log(sum);
  double entropy = 0;
  for (int i = 0; i < n; ++i) {
    const double w = cand_[size_t(i)].p;
    if (w > 0) entropy -= w / sum * (std::log(w) - log_sum);
  }
  const auto surprise_gap = [&](const Candidate& c) {
    return c.p > 0 ? std::abs(log_sum - std::log(double(c.p)) - entropy) : INFINITY;
  };
  const auto before = [&](const Candidate& a, const Candidate& b) {
    const double da = surprise_gap(a), db = surprise_gap(b);
    return da < db || (da == db && a.id < b.id);
  };
  return nucleus_to_front(n, p_.typical_p * sum, before);
}

TokenLogprobs Sampler::logprobs(std::span<const float> logits, int id, int n_top) {
  MOE_ASSERT(id >= 0 && size_t(id) < logits.size());
  const float m = logits[size_t(argmax(logits))];
  double z = 0;
  for (float x : logits) z += std::exp(double(x) - m);
  const double lse = m + std::log(z);
  TokenLogprobs out;
  out.logprob = float(logits[size_t(id)] - lse);
  // The n_top best by one pass with a small sorted list: most entries fail the first compare.
  const size_t k = std::min(size_t(std::max(n_top, 0)), logits.size());
  std::vector<int> best;
  best.reserve(k + 1);
  const auto better = logit_before(logits);
  for (int i = 0; k > 0 && i < int(logits.size()); ++i) {
    if (best.size() == k && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (best.size() > k) best.pop_back();
  }
  for (int b : best) out.top.push_back({b, float(logits[size_t(b)] - lse)});
  return out;
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
