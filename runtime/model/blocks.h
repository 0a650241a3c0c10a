// The CPU pass's block interfaces. A layer is an attention block then an FFN block (each behind
// an RMSNorm, with the residual added after it: runtime/model/layer_stack.h); the kinds and their
// options come from the layer's LayerSpec (runtime/model/layer_plan.h).
//
// One step carries the rows of one sequence (CpuForward::forward_chunk) or of several (a batch),
// each at its own position with its own state: a block owns the per-sequence state it needs (a
// KV cache, a latent cache) for every sequence, by state index.
#pragma once

#include <span>

#include "common/thread_pool.h"
#include "runtime/model/dense_weights.h"

namespace moestream {

class RoutingStep;

// Wall seconds per phase of the routed experts, summed over calls.
struct PhaseTimes {
  double router_s = 0, expert_io_s = 0, expert_compute_s = 0;
};

// Look-ahead (issue 19, CPU `moe_lookahead`), decode steps of one token only: while a layer's
// experts load and compute, the next MoE layer's router (`next`, MoE layer `layer`) ranks its
// experts on this layer's input, and the `width` best are handed to
// ExpertStore::prefetch_predicted. Never changes the output.
struct Lookahead {
  const LayerWeights* next = nullptr;
  int layer = -1;
  int width = 0;  // 0: off
  bool logit_bias = false;  // the next router's logits add its bias (gpt-oss)
  // Benchmarks with a replayed routing (the chunk's override): predict from the override of the
  // next layer (its ids first, then the router's ranking up to `width`): a perfect predictor.
  bool from_override = false;
};

// A sequence of the step: rows [row0, row0 + n_tokens) at positions n_past.., its state index
// (kOwnSequence for forward_chunk's sequence, batch_state(slot) for a batch's).
struct StepSequence {
  int state = 0;
  int row0 = 0, n_tokens = 0, n_past = 0;
};
inline constexpr int kOwnSequence = 0;
inline int batch_state(int slot) { return slot + 1; }

struct LayerStep {
  ThreadPool& pool;
  int T = 0;                                 // rows of the step
  std::span<const int> splits;               // row boundaries of the sequences: 0 first, T last
  std::span<const StepSequence> sequences;   // in row order
  const float* cos = nullptr;                // [T, rope half]: each row's RoPE at its position
  const float* sin = nullptr;
  // Routed experts: the step's routing (override, id check, cache-aware swap, events), their
  // phase times, the look-ahead of this layer (set per layer by the stack).
  RoutingStep* routing = nullptr;
  PhaseTimes* expert_times = nullptr;
  Lookahead lookahead;
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // The step's normalised rows h [T, D] -> out [T, D]; each sequence's keys join its state.
  virtual void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) = 0;
  // Makes state `state` before a step uses it (allocation outside the timed layers). A state's
  // memory is address space until positions are written, and stays for the state's next sequence.
  virtual void prepare(int state) = 0;
  // Bytes of the states made so far (their address space).
  virtual size_t state_bytes() const = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  // The step's normalised rows h [T, D] -> out [T, D].
  virtual void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) = 0;
};

}  // namespace moestream
