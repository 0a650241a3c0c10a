// Implementation of cluster/ordering.h. Local search works on the distinct token sets with their
// counts, so a pass costs (moves x distinct sets x k), independent of the trace length.
#include "cluster/ordering.h"

#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>

#include "common/error.h"

namespace moestream::cluster {

OrderMethod parse_order_method(std::string_view name) {
  if (name == "identity") return OrderMethod::kIdentity;
  if (name == "greedy") return OrderMethod::kGreedy;
  if (name == "seriation") return OrderMethod::kSeriation;
  throw ConfigError("unknown ordering method '" + std::string(name) +
                    "' (expected identity, greedy or seriation)");
}

std::vector<uint32_t> slots_of(const Order& order) {
  std::vector<uint32_t> slot(order.size());
  for (uint32_t s = 0; s < order.size(); ++s) slot[order[s]] = s;
  return slot;
}

Order greedy_chain(const LayerStats& s) {
  const uint32_t n = s.n_experts;
  Order order;
  std::vector<bool> used(n, false);
  auto better_start = [&](uint32_t a, uint32_t b) { return s.uses[a] > s.uses[b]; };
  uint32_t cur = 0;
  for (uint32_t e = 1; e < n; ++e)
    if (better_start(e, cur)) cur = e;
  for (;;) {
    order.push_back(cur);
    used[cur] = true;
    if (order.size() == n) break;
    int best = -1;
    for (uint32_t e = 0; e < n; ++e) {
      if (used[e]) continue;
      if (best < 0 || s.at(cur, e) > s.at(cur, uint32_t(best)) ||
          (s.at(cur, e) == s.at(cur, uint32_t(best)) && s.uses[e] > s.uses[uint32_t(best)]))
        best = int(e);
    }
    cur = uint32_t(best);
  }
  return order;
}

Order spectral_order(const LayerStats& s) {
  const int n = int(s.n_experts);
  Eigen::MatrixXd L = Eigen::MatrixXd::Zero(n, n);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) {
        L(a, b) = -s.at(uint32_t(a), uint32_t(b));
        L(a, a) += s.at(uint32_t(a), uint32_t(b));
      }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(L);
  MOE_ASSERT(es.info() == Eigen::Success, "eigen solver failed on a symmetric matrix");
  const Eigen::VectorXd f = es.eigenvectors().col(std::min(1, n - 1));
  Order order = Order(size_t(n));
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return f(a) < f(b); });
  return order;
}

namespace {

struct WeightedSets {
  std::vector<ExpertSet> sets;
  std::vector<double> weight;
};

WeightedSets distinct_sets(const LayerStats& s) {
  std::map<ExpertSet, double> m;
  for (ExpertSet t : s.token_sets) {
    std::sort(t.begin(), t.end());
    m[t] += 1.0;
  }
  WeightedSets w;
  for (auto& [k, v] : m) {
    w.sets.push_back(k);
    w.weight.push_back(v);
  }
  return w;
}

double cost(const WeightedSets& w, const std::vector<uint32_t>& slot, const SlotGeometry& g,
            const IoProfile& p) {
  const double per_byte_us = 1.0 / (p.bandwidth_gbps * 1e3);
  double total = 0;
  uint32_t slots[64];
  for (size_t i = 0; i < w.sets.size(); ++i) {
    const ExpertSet& t = w.sets[i];
    for (size_t j = 0; j < t.size(); ++j) slots[j] = slot[t[j]];
    ReadCost c = token_read_cost(std::span<const uint32_t>(slots, t.size()), g);
    total += w.weight[i] * (double(c.ops) * p.op_latency_us + double(c.bytes) * per_byte_us);
  }
  return total;
}

}  // namespace

Order local_search(const LayerStats& s, Order order, const SlotGeometry& g, const IoProfile& p,
                   const LocalSearchOptions& opts) {
  const WeightedSets w = distinct_sets(s);
  const size_t n = order.size();
  if (n < 3 || w.sets.empty()) return order;
  const auto t0 = std::chrono::steady_clock::now();
  auto out_of_time = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > opts.max_seconds;
  };
  double best = cost(w, slots_of(order), g, p);
  Order cand;
  for (int pass = 0; pass < opts.max_passes && !out_of_time(); ++pass) {
    bool improved = false;
    // Insertion: take the expert at slot i and put it at slot j.
    for (size_t i = 0; i < n && !out_of_time(); ++i)
      for (size_t j = 0; j < n; ++j) {
        if (i == j) continue;
        cand = order;
        uint32_t e = cand[i];
        cand.erase(cand.begin() + long(i));
        cand.insert(cand.begin() + long(j), e);
        double c = cost(w, slots_of(cand), g, p);
        if (c < best - 1e-9) {
          best = c;
          order.swap(cand);
          improved = true;
        }
      }
    // 2-opt: reverse slots [i, j].
    for (size_t i = 0; i + 1 < n && !out_of_time(); ++i)
      for (size_t j = i + 1; j < n; ++j) {
        cand = order;
        std::reverse(cand.begin() + long(i), cand.begin() + long(j) + 1);
        double c = cost(w, slots_of(cand), g, p);
        if (c < best - 1e-9) {
          best = c;
          order.swap(cand);
          improved = true;
        }
      }
    if (!improved) break;
  }
  return order;
}

Order order_layer(OrderMethod m, const LayerStats& s, const SlotGeometry& g, const IoProfile& p,
                  const LocalSearchOptions& opts) {
  switch (m) {
    case OrderMethod::kIdentity: {
      Order o(s.n_experts);
      std::iota(o.begin(), o.end(), 0u);
      return o;
    }
    case OrderMethod::kGreedy:
      return greedy_chain(s);
    case OrderMethod::kSeriation: {
      LocalSearchOptions half = opts;
      half.max_seconds = opts.max_seconds / 2;
      Order a = local_search(s, spectral_order(s), g, p, half);
      Order b = local_search(s, greedy_chain(s), g, p, half);
      const WeightedSets w = distinct_sets(s);
      return cost(w, slots_of(a), g, p) <= cost(w, slots_of(b), g, p) ? a : b;
    }
  }
  MOE_ASSERT(false, "unhandled ordering method");
  return {};
}

}  // namespace moestream::cluster
