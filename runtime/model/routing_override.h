// A hook that replaces the router's expert choice (Model::set_routing_override): the MoE layer
// still computes the router logits, then takes the ids and weights the override writes.
#pragma once

#include <cstdint>
#include <functional>

namespace moestream {

// Called once per layer per forward chunk, after the router. `ordinal` counts the tokens the
// model has routed since load (never reset), so token t of the chunk is ordinal + t. Writes
// n_tokens * top_k distinct expert ids in [0, n_experts) and their weights, token-major.
using RoutingOverrideFn =
    std::function<void(int layer, uint64_t ordinal, int n_tokens, int* ids, float* weights)>;

}  // namespace moestream
