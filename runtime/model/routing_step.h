// The routing step of one MoE layer for one chunk, the same for the CPU pass, the GPU pass and
// batches of sequences. After the router wrote its exact top-k: each sequence's override (a
// replayed routing), the id check, cache-aware substitution against one residency snapshot; after
// the layer, the routing events, one per sequence. The router maths are routing.h's; how the pass
// gets logits and residency to the host is the pass's business.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "loader/format/model_config.h"
#include "runtime/model/cache_aware_router.h"
#include "runtime/model/forward_pass.h"
#include "runtime/model/routing.h"

namespace moestream {

// One sequence's rows in a chunk: rows [row0, row0 + n_rows) of the layer's [T, k] choices.
struct RoutingSequence {
  int row0 = 0, n_rows = 0;
  int position = 0;        // its first row's position (RoutingEvent::position)
  bool prefill = false;    // RoutingEvent::prefill
  int slot = -1;           // RoutingEvent::sequence: -1 for forward_chunk's one sequence
  const RoutingOverrideFn* override = nullptr;  // its replay, null or empty: the router decides
  uint64_t ordinal = 0;    // the override's clock for the first row
};

// Fills resident[e] != 0 for each expert of MoE layer `layer` the pass reads without storage.
using ResidencyFn = std::function<void(int layer, std::span<uint8_t> resident)>;

class RoutingStep {
 public:
  explicit RoutingStep(const ModelConfig& cfg);
  RoutingStep(const RoutingStep&) = delete;  // sequences_ may point at its own one_
  RoutingStep& operator=(const RoutingStep&) = delete;

  // Per chunk, before its first layer: what decides (control) and whose rows these are
  // (sequences, in row order, covering every row). cache-aware counters go to `stats`.
  // Throws ConfigError for a combination no pass computes (cache-aware routing of gpt-oss's
  // router). The spans must outlive the chunk.
  void begin_chunk(const RoutingControl& control, std::span<const RoutingSequence> sequences,
                   CacheAwareStats& stats);
  // The chunk's only sequence, as forward_chunk runs it: rows [0, n_tokens).
  void begin_chunk(const RoutingControl& control, const ForwardChunk& chunk, CacheAwareStats& stats);

  // Whether decide() substitutes (cache-aware routing, no override): it then needs the logits.
  bool substitutes() const { return substitute_; }
  // Whether every choice is the router's own (no override, no substitution).
  bool router_only() const { return !substitute_ && !any_override_; }
  // Whether publish() hands events to anyone (the pass then brings the router inputs to the host).
  bool observed() const { return bool(control_->on_routing); }
  // The override of a chunk of one sequence (look-ahead's exact predictor), else null.
  const RoutingOverrideFn* chunk_override() const;
  uint64_t chunk_ordinal() const { return sequences_.empty() ? 0 : sequences_.front().ordinal; }

  // MoE layer `layer` (ModelConfig::moe_layer_index): ids/weights hold the router's exact top-k,
  // [T, k] token-major on the host, and are rewritten in place. logits: the raw router logits
  // [T, n_experts] (read only when substitutes()); selection_bias: the sigmoid router's
  // correction bias or null; residency: asked once, only when substituting. Throws FormatError
  // naming the layer when an id is outside [0, n_experts). Returns whether any id or weight
  // differs from the router's.
  bool decide(int layer, int* ids, float* weights, const float* logits, const float* selection_bias,
              const ResidencyFn& residency);

  // The final choices of MoE layer `layer` to on_routing, one event per sequence (tagged with its
  // slot), with the normalised rows the router saw (router_inputs: [T, hidden]).
  void publish(int layer, const int* ids, const float* weights, const float* router_inputs) const;

 private:
  int E_, K_, D_, first_dense_;
  bool softmax_topk_router_;
  const RoutingControl* control_ = nullptr;
  CacheAwareStats* stats_ = nullptr;
  std::span<const RoutingSequence> sequences_;
  RoutingSequence one_;                // begin_chunk(ForwardChunk)'s sequence
  std::vector<int> splits_;            // row boundaries of sequences_: 0 first, T last
  bool any_override_ = false, substitute_ = false;
  CacheAwareRouter cache_aware_;
  std::vector<uint8_t> resident_;      // [E]
};

}  // namespace moestream
