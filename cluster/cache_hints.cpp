// Implementation of cluster/cache_hints.h.
#include "cluster/cache_hints.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <span>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"

namespace moestream {

CacheHints make_lookahead_hints(const RoutingLog& log, bool decode_only,
                                const std::vector<std::vector<float>>& routers, int depth, int width,
                                int self_width) {
  const RoutingLogHeader& h = log.header;
  const size_t hidden = h.hidden, n_experts = h.n_experts;
  if (routers.size() != h.n_layers)
    throw ConfigError("look-ahead: " + std::to_string(routers.size()) + " routers for a log of " +
                      std::to_string(h.n_layers) + " layers");
  for (size_t l = 0; l < routers.size(); ++l)
    if (routers[l].size() != n_experts * hidden)
      throw ConfigError("look-ahead: router of layer " + std::to_string(l) + " has " +
                        std::to_string(routers[l].size()) + " floats, the log's shape needs " +
                        std::to_string(n_experts) + " x " + std::to_string(hidden));
  if (depth < 0 || width < 1 || size_t(width) > n_experts || self_width < 0 ||
      size_t(self_width) > n_experts)
    throw ConfigError("look-ahead: depth must be >= 0 and widths in 1.." + std::to_string(n_experts));
  CacheHints out;
  out.width = std::max(width, self_width);
  std::vector<float> logits(n_experts);
  std::vector<int> order(n_experts);
  for (const RoutingRecord& r : log.records) {
    if (decode_only && r.phase != RoutingPhase::kDecode) continue;
    if (r.router_input.size() != hidden)
      throw ConfigError("look-ahead: a routing record (request " + std::to_string(r.request_id) +
                        ", layer " + std::to_string(r.layer) +
                        ") has no router input: collect the log with " + option_ref("collect_router_inputs", "true"));
    out.group_begin.push_back(uint32_t(out.layer.size()));
    for (int j = self_width > 0 ? 0 : 1; j <= depth && size_t(r.layer) + size_t(j) < h.n_layers; ++j) {
      // j = 0: the layer's own router, all its scores ranked: a guess of its next step.
      const size_t w_j = size_t(j == 0 ? self_width : width);
      const std::vector<float>& w = routers[size_t(r.layer) + size_t(j)];
      for (size_t e = 0; e < n_experts; ++e) {
        float s = 0;
        for (size_t i = 0; i < hidden; ++i) s += w[e * hidden + i] * r.router_input[i];
        logits[e] = s;
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + ptrdiff_t(w_j), order.end(),
                        [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
      out.layer.push_back(int(r.layer) + j);
      out.experts.insert(out.experts.end(), order.begin(), order.begin() + ptrdiff_t(w_j));
      out.experts.resize(out.layer.size() * size_t(out.width), -1);  // padding: -1, dropped
    }
  }
  out.group_begin.push_back(uint32_t(out.layer.size()));
  return out;
}

CacheHints make_oracle_hints(const CacheTrace& t, int depth, double noise, uint64_t seed) {
  CacheHints out;
  uint32_t widest = 0;
  for (size_t g = 0; g < t.n_groups(); ++g) widest = std::max(widest, t.group_begin[g + 1] - t.group_begin[g]);
  out.width = int(widest);
  // By group: the group of the same layer in the next step, or none.
  std::vector<size_t> next_visit(t.n_groups(), SIZE_MAX);
  {
    std::vector<size_t> seen(size_t(t.n_layers), SIZE_MAX);
    size_t step_end = t.n_groups();  // first group of the step after the current one
    std::vector<size_t> pending;
    for (size_t g = t.n_groups(); g-- > 0;) {
      const int layer = t.keys[t.group_begin[g]] / t.n_experts;
      pending.push_back(g);
      if (t.step_begins[g]) {  // step [g, step_end): its next visits are the groups seen so far
        for (size_t q : pending) next_visit[q] = seen[size_t(t.keys[t.group_begin[q]] / t.n_experts)];
        for (size_t q : pending) seen[size_t(t.keys[t.group_begin[q]] / t.n_experts)] = q;
        pending.clear();
        step_end = g;
      }
      (void)layer;
    }
    (void)step_end;
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> coin(0, 1);
  std::uniform_int_distribution<int> any(0, t.n_experts - 1);
  auto guess = [&](size_t g) {
    const uint32_t b = t.group_begin[g], e = t.group_begin[g + 1];
    out.layer.push_back(t.keys[b] / t.n_experts);
    for (uint32_t i = b; i < e; ++i) {
      int id = t.keys[i] % t.n_experts;
      if (coin(rng) < noise) {
        int other;
        do other = any(rng);
        while (std::find_if(t.keys.begin() + b, t.keys.begin() + e,
                            [&](int k) { return k % t.n_experts == other; }) != t.keys.begin() + e);
        id = other;
      }
      out.experts.push_back(id);
    }
    out.experts.resize(out.layer.size() * size_t(out.width), -1);
  };
  for (size_t g = 0; g < t.n_groups(); ++g) {
    out.group_begin.push_back(uint32_t(out.layer.size()));
    if (next_visit[g] != SIZE_MAX) guess(next_visit[g]);
    for (size_t j = 1; j <= size_t(depth) && g + j < t.n_groups() && !t.step_begins[g + j]; ++j) guess(g + j);
  }
  out.group_begin.push_back(uint32_t(out.layer.size()));
  return out;
}

CacheSimResult simulate_policy_with_hints(const CacheTrace& t, CachePolicy& policy,
                                          const CacheHints& hints) {
  if (hints.group_begin.size() != t.group_begin.size())
    throw ConfigError("cache_sim: the guesses cover " + std::to_string(hints.group_begin.size()) +
                      " groups, the trace has " + std::to_string(t.group_begin.size()));
  return simulate_policy(t, policy, [&](size_t g) {
    // The engine routes layer L and guesses from its router input before L's experts are acquired.
    const int from = t.keys[t.group_begin[g]] / t.n_experts;
    for (uint32_t q = hints.group_begin[g]; q < hints.group_begin[g + 1]; ++q) {
      const int* ids = hints.experts.data() + size_t(q) * size_t(hints.width);
      size_t n = 0;
      while (n < size_t(hints.width) && ids[n] >= 0) ++n;  // -1 pads a narrower guess
      policy.hint(from, hints.layer[q], std::span<const int>(ids, n));
    }
  });
}

}  // namespace moestream
