// Orderings of a layer's experts on disk from co-activation statistics: identity, the greedy
// chain baseline, and spectral seriation refined by local search on the I/O cost model.
#pragma once

#include <cstdint>
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
// co-activated experts get close coordinates, hence close slots.
Order spectral_order(const LayerStats& s);

struct LocalSearchOptions {
  double max_seconds = 20.0;  // per layer; a pass in progress finishes its current move scan
  int max_passes = 50;
};

// Improves `order` by insertion moves (one expert to another slot) and 2-opt segment reversals,
// accepting a move only when it lowers the modelled I/O time of the layer's tokens.
Order local_search(const LayerStats& s, Order order, const SlotGeometry& g, const IoProfile& p,
                   const LocalSearchOptions& opts = {});

// The method's order for one layer. kSeriation runs local search from the spectral order and from
// the greedy chain and keeps the cheaper on the training tokens.
Order order_layer(OrderMethod m, const LayerStats& s, const SlotGeometry& g, const IoProfile& p,
                  const LocalSearchOptions& opts = {});

// logical -> physical slot of an order.
std::vector<uint32_t> slots_of(const Order& order);

}  // namespace moestream::cluster
