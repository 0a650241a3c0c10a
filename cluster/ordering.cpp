// Implementation of cluster/ordering.h. Local search works on the distinct token sets with their
// counts, so a move costs (distinct sets x k), independent of the trace length; it stops after a
// move budget, never on a clock.
#include "cluster/ordering.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
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
  // The solver may return either sign and differ in the last bits between builds: fix the sign
  // and compare rounded coordinates, so such noise moves experts only at a rounding boundary.
  Eigen::Index top = 0;
  for (Eigen::Index a = 1; a < f.size(); ++a)
    if (std::abs(f(a)) > std::abs(f(top))) top = a;
  const double scale = f(top) == 0 ? 0.0 : std::ldexp(1.0, 30) / f(top);
  std::vector<int64_t> coord(static_cast<size_t>(n));
  for (int a = 0; a < n; ++a) coord[size_t(a)] = std::llround(f(a) * scale);
  Order order = Order(size_t(n));
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return coord[a] < coord[b]; });
  return order;
}

namespace {

struct WeightedSets {
  std::vector<ExpertSet> sets;
  std::vector<uint64_t> weight;  // tokens with this set
};

WeightedSets distinct_sets(const LayerStats& s) {
  std::map<ExpertSet, uint64_t> m;
  for (ExpertSet t : s.token_sets) {
    std::sort(t.begin(), t.end());
    ++m[t];
  }
  WeightedSets w;
  for (auto& [k, v] : m) {
    w.sets.push_back(k);
    w.weight.push_back(v);
  }
  return w;
}

// Modelled time of the layer's tokens in femtoseconds, exact: integer op and byte counts times
// integer prices, so every machine and compiler compares two orders alike (a floating-point sum
// could round a near tie either way). 128 bits: bytes x price exceeds 64 bits on long traces.
using Cost = unsigned __int128;

struct Prices {
  uint64_t op_fs = 0;    // per read
  uint64_t byte_fs = 0;  // per byte
};

Prices prices_of(const IoProfile& p) {
  MOE_ASSERT(p.op_latency_us >= 0 && p.bandwidth_gbps > 0, "I/O profile without positive bandwidth");
  return {uint64_t(std::llround(serial_op_us(p) * 1e9)), uint64_t(std::llround(1e6 / p.bandwidth_gbps))};
}

Cost cost(const WeightedSets& w, const Order& order, const SlotGeometry& g, const Prices& pr) {
  thread_local std::vector<uint32_t> slot;  // logical -> physical, reused across moves
  slot.resize(order.size());
  for (uint32_t s = 0; s < order.size(); ++s) slot[order[s]] = s;
  uint64_t ops = 0, bytes = 0;
  thread_local std::vector<uint32_t> slots;  // a token's slots; top-k is bounded only by n_experts
  for (size_t i = 0; i < w.sets.size(); ++i) {
    const ExpertSet& t = w.sets[i];
    slots.resize(t.size());
    for (size_t j = 0; j < t.size(); ++j) slots[j] = slot[t[j]];
    ReadCost c = token_read_cost(slots, g);
    ops += w.weight[i] * c.ops;
    bytes += w.weight[i] * c.bytes;
  }
  return Cost(ops) * pr.op_fs + Cost(bytes) * pr.byte_fs;
}

}  // namespace

Order local_search(const LayerStats& s, Order order, const SlotGeometry& g, const IoProfile& p,
                   const LocalSearchOptions& opts, SearchStats* stats) {
  SearchStats st;
  const WeightedSets w = distinct_sets(s);
  const size_t n = order.size();
  const Prices pr = prices_of(p);
  Cost best = n < 3 || w.sets.empty() ? 0 : cost(w, order, g, pr);
  Order cand;
  // Prices the candidate and keeps it when cheaper.
  bool improved = false;
  auto consider = [&]() {
    ++st.moves;
    const Cost c = cost(w, cand, g, pr);
    if (c < best) {
      best = c;
      order.swap(cand);
      improved = true;
    }
  };
  bool spent = n < 3 || w.sets.empty();
  st.converged = spent;
  while (!spent) {
    improved = false;
    // Insertion: take the expert at slot i and put it at slot j.
    for (size_t i = 0; i < n && !spent; ++i)
      for (size_t j = 0; j < n && !spent; ++j) {
        if (i == j) continue;
        if (st.moves >= opts.max_moves) {
          spent = true;
          break;
        }
        cand = order;
        const uint32_t e = cand[i];
        cand.erase(cand.begin() + long(i));
        cand.insert(cand.begin() + long(j), e);
        consider();
      }
    // 2-opt: reverse slots [i, j].
    for (size_t i = 0; i + 1 < n && !spent; ++i)
      for (size_t j = i + 1; j < n && !spent; ++j) {
        if (st.moves >= opts.max_moves) {
          spent = true;
          break;
        }
        cand = order;
        std::reverse(cand.begin() + long(i), cand.begin() + long(j) + 1);
        consider();
      }
    if (spent) break;
    ++st.passes;
    if (opts.progress) opts.progress({st.moves, opts.max_moves, st.passes});
    if (!improved) {
      st.converged = true;
      break;
    }
  }
  if (stats) *stats = st;
  return order;
}

Order order_layer(OrderMethod m, const LayerStats& s, const SlotGeometry& g, const IoProfile& p,
                  const LocalSearchOptions& opts, SearchStats* stats) {
  if (stats) *stats = {};
  switch (m) {
    case OrderMethod::kIdentity: {
      Order o(s.n_experts);
      std::iota(o.begin(), o.end(), 0u);
      return o;
    }
    case OrderMethod::kGreedy:
      return greedy_chain(s);
    case OrderMethod::kSeriation: {
      // Both searches report their progress as the layer's: the second after the first's moves.
      SearchStats sa, sb;
      LocalSearchOptions half;
      if (opts.progress)
        half.progress = [&](const SearchProgress& q) {
          opts.progress({sa.moves + q.moves, opts.max_moves, sa.passes + q.passes});
        };
      half.max_moves = opts.max_moves / 2;
      Order a = local_search(s, spectral_order(s), g, p, half, &sa);
      half.max_moves = opts.max_moves - sa.moves;
      Order b = local_search(s, greedy_chain(s), g, p, half, &sb);
      if (stats) *stats = {sa.moves + sb.moves, sa.passes + sb.passes, sa.converged && sb.converged};
      const WeightedSets w = distinct_sets(s);
      const Prices pr = prices_of(p);
      return cost(w, a, g, pr) <= cost(w, b, g, pr) ? a : b;
    }
  }
  MOE_ASSERT(false, "unhandled ordering method");
  return {};
}

}  // namespace moestream::cluster
