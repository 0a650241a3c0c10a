// The routed experts of a layer (FfnKind::kRouted) on the CPU: the router (the layer's RouterSpec:
// softmax top-k, gpt-oss's softmax over the selected logits, the grouped routers of routing.h),
// the selected experts fetched from the ExpertStore, SwiGLU through quant_matvec, weighted sum,
// plus the shared expert (gated or not) from the dense weights. MoeLayer is the engine every
// routed layer of a pass shares (its scratch, the store, the residency snapshot); RoutedExperts
// is a layer's block over it.
#pragma once

#include <span>
#include <vector>

#include "kernels/cpu/matvec_input.h"
#include "runtime/model/blocks.h"
#include "runtime/model/expert_compute.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/dense_ops.h"
#include "loader/store/expert_store.h"
#include "loader/format/model_config.h"
#include "runtime/model/routing.h"
#include "runtime/model/routing_step.h"

namespace moestream {

class MoeLayer {
 public:
  MoeLayer(const ModelConfig& cfg, ExpertStore& store, int max_batch);
  MoeLayer(const MoeLayer&) = delete;  // residency_ calls back into this object
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x: the step's T normalised rows [T, D]; writes out [T, D]. Experts as the router (`spec`)
  // and the step's routing (begun for this step) decide; w is the decoder layer's weights. The
  // dense products (router, shared expert) run over each sequence's rows as its run alone
  // (step.splits); experts are fetched once for all rows. Then, when the routing is observed,
  // this layer's first uses are verified and its choices published.
  void forward(const LayerStep& step, const FfnSpec& spec, const LayerWeights& w, const float* x, float* out);

  // Deferred first-use checks (ExpertStore::set_deferred_checks, set by CpuForward): the hashes
  // queued on `pool` during forward() run there (those no thread took yet), then the store
  // compares them all and throws the checksum error naming the expert of one that failed. A pass
  // calls this before anything computed from this layer's experts leaves it. Seconds waited
  // are added to `wait_s`.
  void verify_pending(ThreadPool& pool, double& wait_s);

 private:
  const ModelConfig& cfg_;
  ExpertStore& store_;
  int D_, F_, E_, K_, max_batch_;
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
  void shared_expert(const LayerStep& step, SharedExpertKind kind, const LayerWeights& w, const float* x);
  RowMatrix shared_act_, shared_up_;  // [max_batch, Fs]
  RowMatrix shared_scratch_;          // [max_batch, Fs]: swiglu_ranges of a batch
  RowMatrix shared_y_;                // [max_batch, D]
  RowMatrix shared_logit_;            // [max_batch, 1]
  ExpertCompute compute_;  // the pairs' products (decode: inputs rounded once)
  // Cache-aware routing's residency snapshot: experts not on storage at the chunk's start.
  std::vector<ExpertTier> tiers_;  // [E]
  ResidencyFn residency_;
  // Look-ahead: the next layer's router logits and its best ids (LayerStep::lookahead).
  void predict_next(const LayerStep& step, const float* x);
  RowMatrix la_logits_;                   // [1, E]
  std::vector<int> la_ids_;               // [E]
  std::vector<float> la_weights_;         // [E] (unused: the ranking is by logit)
  std::vector<int> la_exact_;             // [K + E]: lookahead_from_override's ids, then the ranking
};

class RoutedExperts final : public FfnBlock {
 public:
  RoutedExperts(const FfnSpec& spec, MoeLayer& engine) : spec_(spec), engine_(engine) {}
  void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) override {
    engine_.forward(step, spec_, w, h, out);
  }

 private:
  FfnSpec spec_;
  MoeLayer& engine_;
};

}  // namespace moestream
