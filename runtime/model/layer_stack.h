// The CPU pass's layers, built from the model's layer plan (runtime/model/layer_plan.h): per layer
// an attention block and an FFN block of the kinds its LayerSpec names, each behind an RMSNorm
// with the residual added after it. One loop runs a step of one sequence or of several.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "loader/format/model_config.h"
#include "loader/store/expert_store.h"
#include "runtime/model/attention.h"
#include "runtime/model/blocks.h"
#include "runtime/model/dense_mlp.h"
#include "runtime/model/forward_types.h"
#include "runtime/model/layer_plan.h"
#include "runtime/model/mla_attention.h"
#include "runtime/model/moe_layer.h"

namespace moestream {

class LayerStack {
 public:
  // `cfg`, `w` and `store` are not owned and outlive the stack. Sizes scratch for steps of
  // max_batch rows and states for max_context positions; makes state kOwnSequence.
  LayerStack(const ModelConfig& cfg, const DenseWeights& w, ExpertStore& store, int max_context, int max_batch);

  // Every layer over the step's rows x [T, D], in place. `lookahead_width` > 0: each routed layer
  // of a one-token step predicts the next routed layer's experts (Lookahead). Wall time per phase
  // goes to `times`.
  void forward(LayerStep& step, float* x, int lookahead_width, bool lookahead_from_override, ForwardTimes& times);

  // Makes sequence state `state` in every layer (before the timed layers).
  void prepare(int state);
  // Deferred first-use checks of the routed experts (MoeLayer::verify_pending).
  void verify_pending(ThreadPool& pool, double& wait_s) { moe_.verify_pending(pool, wait_s); }
  const std::vector<LayerSpec>& plan() const { return plan_; }

 private:
  const ModelConfig& cfg_;
  const DenseWeights& w_;
  std::vector<LayerSpec> plan_;
  int max_batch_;
  // Scratch the blocks of a kind share (made when a layer takes the kind).
  std::optional<GqaScratch> gqa_scratch_;
  std::optional<MlaScratch> mla_scratch_;
  std::optional<DenseMlpScratch> mlp_scratch_;
  MoeLayer moe_;  // the routed layers' engine
  std::vector<std::unique_ptr<AttentionBlock>> attention_;
  std::vector<std::unique_ptr<FfnBlock>> ffn_;
  PhaseTimes expert_times_;
  RowMatrix h_, tmp_;  // [max_batch, D]: a block's normalised input and its output
};

}  // namespace moestream
