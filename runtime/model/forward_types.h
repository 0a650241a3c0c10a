// What a forward pass reports to the engine's callers: wall time per phase and the routing
// events of --collect-routing. Plain data (runtime/engine/model.h exposes them).
#pragma once

#include <functional>

namespace moestream {

// Wall seconds per phase, summed over forward calls (Model::times(), reset_times()).
struct ForwardTimes {
  double attention_s = 0;        // QKV/O projections, QK-norm, RoPE, attention
  double router_s = 0;           // router logits, softmax, top-k
  double expert_io_s = 0;        // waiting for ExpertStore::fetch
  double expert_compute_s = 0;   // SwiGLU expert matvecs and the weighted sum
  double other_s = 0;            // embedding, norms, residuals, lm_head
  double total() const { return attention_s + router_s + expert_io_s + expert_compute_s + other_s; }
};

// One layer's routing decisions for a chunk of tokens, for routing logs (--collect-routing).
struct RoutingEvent {
  int layer = 0;         // the MoE layer index (ModelConfig::moe_layer_index; dense-MLP layers do not route)
  int position = 0;      // position of the chunk's first token in the sequence
  int n_tokens = 0;
  int top_k = 0, hidden = 0;
  bool prefill = false;  // part of the first forward call after reset() (the prompt)
  const int* ids = nullptr;             // [n_tokens, top_k] logical ids, best first
  const float* weights = nullptr;       // [n_tokens, top_k]
  const float* router_inputs = nullptr; // [n_tokens, hidden]: the normalised rows the router saw
  // Batches (ForwardPass::forward_batch): the sequence slot these tokens belong to; -1 for the
  // single sequence of forward_chunk. Keeps traces of concurrent sequences separable.
  int sequence = -1;
};
using RoutingCallback = std::function<void(const RoutingEvent&)>;

}  // namespace moestream
