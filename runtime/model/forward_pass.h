// The one interface of a decoder forward pass, so Model (runtime/engine/model.h) drives the CPU
// pass (runtime/model/cpu_forward.h) and the GPU pass (runtime/gpu/gpu_forward.h) alike.
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/model/cache_aware_options.h"
#include "runtime/model/forward_types.h"
#include "runtime/model/routing_override.h"

namespace moestream {

// One chunk of at most max_batch tokens, as Model hands it to a pass.
struct ForwardChunk {
  const int* tokens = nullptr;
  int n_tokens = 0;
  int n_past = 0;            // position of tokens[0]; the chunk's KV rows are written from there
  float* logits = nullptr;   // the last token's logits, or every token's when all_logits; or none
  bool all_logits = false;
  // Greedy decoding (Model::forward_argmax): the pass writes the last token's Sampler::argmax
  // here. logits must then be set (not all_logits) and is scratch: a pass that picks the token
  // on its device leaves it unwritten, so only the id crosses to the host.
  int* argmax = nullptr;
  bool prefill = false;      // RoutingEvent::prefill
  uint64_t ordinal = 0;      // tokens routed since load: token t is ordinal + t (RoutingOverrideFn)
};

// How experts are chosen; Model owns it and both passes honour every field, per layer per chunk:
// the override when set, else the router followed by cache-aware substitution when enabled;
// the final choice goes to on_routing.
struct RoutingControl {
  RoutingCallback on_routing;     // empty = none; observing never changes the output
  RoutingOverrideFn override;     // empty = the router decides
  CacheAwareOptions cache_aware;  // residency: the tiers the pass reads experts through
};

// Slots a batch pass accepts; Model bounds them lower (ModelOptions::max_sequences).
inline constexpr int kMaxBatchSlots = 1024;

// Batches of sequences (continuous batching): one step carries tokens of several sequences, each
// at its own position in its own KV slot. RoutingControl::override (one clock for the model)
// refuses batches; a sequence replays its own routing through `override` instead.
struct BatchEntry {
  int slot = 0;        // the sequence's KV slot, in [0, the pass's slot count)
  ForwardChunk chunk;  // its tokens, position, logits and prefill flag
  // This sequence's expert choice (Model::set_sequence_routing), null = the router's. Called per
  // MoE layer with ordinal = chunk.ordinal, which is then the position of its first token.
  const RoutingOverrideFn* override = nullptr;
};
struct ForwardBatch {
  const BatchEntry* entries = nullptr;
  int n_entries = 0;  // distinct slots; their tokens sum to at most max_batch
  int n_tokens() const {
    int n = 0;
    for (int i = 0; i < n_entries; ++i) n += entries[i].chunk.n_tokens;
    return n;
  }
};

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // Runs the chunk (appending its KV rows) and writes the logits asked for. Adds wall time per
  // phase to `times` and cache-aware counters to `cache_aware`.
  virtual void forward_chunk(const ForwardChunk& chunk, const RoutingControl& routing,
                             ForwardTimes& times, CacheAwareStats& cache_aware) = 0;
  // Runs one step of several sequences (runtime/model/cpu_forward.cpp), each entry appending its KV
  // rows to its slot's cache, independent of forward_chunk's sequence. The default refuses
  // (ConfigError): passes that run one sequence at a time (the GPU's, for now).
  virtual void forward_batch(const ForwardBatch& batch, const RoutingControl& routing,
                             ForwardTimes& times, CacheAwareStats& cache_aware);
};

}  // namespace moestream
