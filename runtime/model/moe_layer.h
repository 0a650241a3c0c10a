// The sparse MLP of one decoder layer: router (softmax, top-k, optional renormalisation), the
// selected experts fetched from the ExpertStore, SwiGLU through quant_matvec, weighted sum, plus
// the shared expert (Qwen2-MoE's gated one, GLM-4.5's ungated one) from the dense weights when the
// model has one. GLM-4.5 / DeepSeek-V3 route through the grouped sigmoid router (routing.h).
#pragma once

#include <span>
#include <vector>

#include "kernels/cpu/matvec_input.h"
#include "runtime/model/expert_compute.h"
#include "runtime/model/dense_ops.h"
#include "loader/store/expert_store.h"
#include "loader/format/model_config.h"
#include "runtime/model/routing.h"
#include "runtime/model/routing_step.h"

namespace moestream {

// Wall seconds per phase of the forward pass, summed over calls.
struct PhaseTimes {
  double attention_s = 0, router_s = 0, expert_io_s = 0, expert_compute_s = 0, other_s = 0;
};

// What one forward() needs beside the routing step (CpuForward and CpuBatchPass fill it per chunk).
struct MoeRouting {
  // Batches (runtime/model/cpu_batch.h): row boundaries of the sequences, 0 first and T last;
  // the dense products (router, shared expert) run once over all rows through linear_ranges, so
  // each sequence gets the numbers of its run alone. Empty: one range. Experts are fetched once
  // for all rows either way.
  std::span<const int> row_splits;
  // Look-ahead (issue 19, CPU --moe-lookahead), decode chunks of one token only: while this
  // layer's experts load and compute, the next MoE layer's router (lookahead_next, MoE layer
  // lookahead_layer) ranks its experts on this layer's input, and the `lookahead` best are
  // handed to ExpertStore::prefetch_predicted. Never changes the output.
  const LayerWeights* lookahead_next = nullptr;
  int lookahead_layer = -1;
  int lookahead = 0;
  // Benchmarks with a replayed routing (the chunk's override): predict from the override of the
  // next layer (its ids first, then the router's ranking up to `lookahead`): a perfect predictor.
  bool lookahead_from_override = false;
};

class MoeLayer {
 public:
  MoeLayer(const ModelConfig& cfg, ExpertStore& store, int max_batch);
  MoeLayer(const MoeLayer&) = delete;  // residency_ calls back into this object
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x: T normalised rows [T, D]; writes out [T, D]. Experts as the router and `step` (begun for
  // this chunk) decide. `layer` is the MoE layer index (ModelConfig::moe_layer_index), w the
  // decoder layer's weights.
  void forward(ThreadPool& pool, int layer, const LayerWeights& w, const float* x, int T,
               float* out, PhaseTimes& times, RoutingStep& step, const MoeRouting& routing);

  // Deferred first-use checks (ExpertStore::set_deferred_checks, set by CpuForward): the hashes
  // queued on `pool` during forward() run there (those no thread took yet), then the store
  // compares them all and throws the checksum error naming the expert of one that failed. A pass
  // calls this before anything computed from this layer's experts leaves it. Seconds waited
  // are added to `wait_s`.
  void verify_pending(ThreadPool& pool, double& wait_s);

  // Routing of the last forward call: T*k expert ids, token-major.
  const std::vector<int>& last_ids() const { return ids_; }
  // Router weights of the last forward call: T*k, token-major, aligned with last_ids().
  const std::vector<float>& last_weights() const { return weights_; }

 private:
  const ModelConfig& cfg_;
  ExpertStore& store_;
  int D_, F_, E_, K_, max_batch_;
  RouterParams router_;  // softmax or grouped sigmoid, scaling
  std::vector<ExpertLayout> layouts_;  // per layer: a GGUF's types may differ between layers
  RowMatrix logits_;          // [max_batch, E]
  std::vector<float> probs_;  // router scratch: RouterParams::scratch_floats()
  std::vector<int> ids_;      // [max_batch*K]
  std::vector<float> weights_;
  // Per fetch chunk: unique experts, their payloads, and (expert, token-slot) pairs.
  std::vector<int> unique_ids_, expert_of_pair_, slot_of_pair_, token_of_pair_;
  std::vector<ExpertMatrices> payloads_;  // by position in the fetch chunk (in place or copied)
  std::vector<int> ready_;                 // chunk positions that landed together
  std::vector<std::vector<int>> slots_of_expert_;  // indexed by expert id
  RowMatrix y_;            // [max_batch*K, D]: expert output per token slot
  // The shared expert: down(silu(gate x) * up x) into shared_y_, times sigmoid(shared_expert_gate . x)
  // when gated.
  void shared_expert(ThreadPool& pool, const LayerWeights& w, const float* x, int T, std::span<const int> splits);
  RowMatrix shared_act_, shared_up_;  // [max_batch, Fs]
  RowMatrix shared_scratch_;          // [max_batch, Fs]: swiglu_ranges of a batch
  RowMatrix shared_y_;                // [max_batch, D]
  RowMatrix shared_logit_;            // [max_batch, 1]
  ExpertCompute compute_;  // the pairs' products (decode: inputs rounded once)
  // Cache-aware routing's residency snapshot: experts not on storage at the chunk's start.
  std::vector<ExpertTier> tiers_;  // [E]
  ResidencyFn residency_;
  // Look-ahead: the next layer's router logits and its best ids (MoeRouting::lookahead).
  void predict_next(ThreadPool& pool, const float* x, const RoutingStep& step, const MoeRouting& routing);
  RowMatrix la_logits_;                   // [1, E]
  std::vector<int> la_ids_;               // [E]
  std::vector<float> la_weights_;         // [E] (unused: the ranking is by logit)
  std::vector<int> la_exact_;             // [K + E]: lookahead_from_override's ids, then the ranking
};

}  // namespace moestream
