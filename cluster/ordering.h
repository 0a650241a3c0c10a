// Orderings of a layer's experts on disk from co-activation statistics: identity, the greedy
// chain baseline, and spectral seriation refined by local search on the I/O cost model.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "cluster/coactivation.h"
#include "cluster/io_cost_model.h"

namespace moestream::cluster {

enum class OrderMethod { kIdentity, kGreedy, kSeriation };
OrderMethod parse_order_method(std::string_view name);  // throws ConfigError naming the value

// An order is the logical expert in each physical slot: order[slot] = logical.
using Order = std::vector<uint32_t>;

// Start at the most used expert; repeatedly append the unvisited expert most often chosen with
// the current one (ties: more uses, then lower id).
Order greedy_chain(const LayerStats& s);

// Experts sorted by the Fiedler vector of the co-activation graph's Laplacian: strongly
// co-activated experts get close coordinates, hence close slots. The vector's sign is fixed (its
// largest entry positive) and coordinates are rounded to 2^-30 of that entry before sorting
// (ties: lower id): last-bit differences between eigen solver builds then reorder experts only
// when a coordinate sits on a rounding boundary.
Order spectral_order(const LayerStats& s);

// Default move budget per layer. A move prices the layer's distinct token sets, so its time grows
// with them: demo-model layers (32 experts, top-4; a pass is 1,488 moves) converge in
// 7,440-16,368 moves, in under 0.5 s with a 540-token log and 1-2 s of CPU with 13k-26k-token
// traces (dev VM). For 128 experts (a pass is 24,384 moves) it bounds the search.
inline constexpr uint64_t kDefaultSearchMoves = 20000;

struct SearchProgress {
  uint64_t moves = 0;      // candidate moves priced so far
  uint64_t max_moves = 0;  // the budget
  int passes = 0;          // passes finished
};

struct LocalSearchOptions {
  // Candidate moves priced per layer, at most (kSeriation splits them between its two starts).
  // The search stops there or after a pass that improves nothing: a count, not a clock, so the
  // same inputs give the same order on every machine.
  uint64_t max_moves = kDefaultSearchMoves;
  // Called after each pass, for a progress line on long searches; never changes the result.
  std::function<void(const SearchProgress&)> progress;
};

struct SearchStats {
  uint64_t moves = 0;      // candidate moves priced
  int passes = 0;          // passes finished
  bool converged = false;  // the last pass improved nothing (else the budget ran out)
};

// Improves `order` by insertion moves (one expert to another slot) and 2-opt segment reversals,
// first improvement, accepting a move only when it lowers the modelled I/O time of the layer's
// tokens (compared exactly, in integer femtoseconds). `stats`, when given, receives the work done.
Order local_search(const LayerStats& s, Order order, const SlotGeometry& g, const IoProfile& p,
                   const LocalSearchOptions& opts = {}, SearchStats* stats = nullptr);

// The method's order for one layer. kSeriation runs local search from the spectral order and from
// the greedy chain (the first gets half the move budget, the second what the first left) and
// keeps the cheaper on the training tokens; `stats` sums the two searches.
Order order_layer(OrderMethod m, const LayerStats& s, const SlotGeometry& g, const IoProfile& p,
                  const LocalSearchOptions& opts = {}, SearchStats* stats = nullptr);

// logical -> physical slot of an order.
std::vector<uint32_t> slots_of(const Order& order);

}  // namespace moestream::cluster
