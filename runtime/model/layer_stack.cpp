// Implementation of runtime/model/layer_stack.h.
#include "runtime/model/layer_stack.h"

#include <chrono>

#include "common/error.h"
#include "common/timing.h"

namespace moestream {

LayerStack::LayerStack(const ModelConfig& cfg, const DenseWeights& w, ExpertStore& store, int max_context,
                       int max_batch)
    : cfg_(cfg), w_(w), plan_(plan_layers(cfg)), max_batch_(max_batch), moe_(cfg, store, max_batch) {
  if (any_attention(plan_, AttentionKind::kGqa)) gqa_scratch_.emplace(cfg, max_context, max_batch);
  if (any_attention(plan_, AttentionKind::kMla)) mla_scratch_.emplace(cfg, max_context, max_batch);
  if (any_ffn(plan_, FfnKind::kDense)) mlp_scratch_.emplace(cfg, max_batch);
  for (const LayerSpec& s : plan_) {
    switch (s.attention.kind) {
      case AttentionKind::kGqa:
        attention_.push_back(std::make_unique<GqaAttention>(cfg, s.attention, *gqa_scratch_, max_context, max_batch));
        break;
      case AttentionKind::kMla:
        attention_.push_back(std::make_unique<MlaAttention>(cfg, *mla_scratch_, max_context, max_batch));
        break;
    }
    switch (s.ffn.kind) {
      case FfnKind::kDense: ffn_.push_back(std::make_unique<DenseMlp>(cfg, *mlp_scratch_)); break;
      case FfnKind::kRouted: ffn_.push_back(std::make_unique<RoutedExperts>(s.ffn, moe_)); break;
    }
  }
  h_.resize(max_batch, cfg.hidden_size);
  tmp_.resize(max_batch, cfg.hidden_size);
  prepare(kOwnSequence);  // the states first: a context too long fails naming the KV cache
  if (gqa_scratch_) gqa_scratch_->allocate();
  if (mla_scratch_) mla_scratch_->allocate();
}

void LayerStack::prepare(int state) {
  for (auto& a : attention_) a->prepare(state);
}

void LayerStack::forward(LayerStep& step, float* x_rows, int lookahead_width, bool lookahead_from_override,
                         ForwardTimes& times) {
  const int T = step.T, D = cfg_.hidden_size;
  MOE_ASSERT(T > 0 && T <= max_batch_);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  RowMap x(x_rows, T, D);
  step.expert_times = &expert_times_;
  const int n = cfg_.n_layers;
  for (int l = 0; l < n; ++l) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    const LayerSpec& spec = plan_[size_t(l)];
    auto ta = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x.row(t).data(), lw.attn_norm.data(), D, eps, h_.row(t).data());
    attention_[size_t(l)]->forward(step, lw, h_.data(), tmp_.data());
    x += tmp_.topRows(T);
    times.attention_s += seconds_since(ta);

    auto tm = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x.row(t).data(), lw.ffn_norm.data(), D, eps, h_.row(t).data());
    // Look-ahead: the next layer's router, when that layer has experts.
    const bool ahead = lookahead_width > 0 && spec.ffn.kind == FfnKind::kRouted && l + 1 < n &&
                       plan_[size_t(l) + 1].ffn.kind == FfnKind::kRouted;
    step.lookahead = Lookahead{};
    if (ahead) {
      step.lookahead.next = &w_.layers[size_t(l) + 1];
      step.lookahead.layer = plan_[size_t(l) + 1].ffn.moe_layer;
      step.lookahead.width = lookahead_width;
      step.lookahead.logit_bias = plan_[size_t(l) + 1].ffn.router.logit_bias;
      step.lookahead.from_override = lookahead_from_override;
    }
    const PhaseTimes before = expert_times_;
    ffn_[size_t(l)]->forward(step, lw, h_.data(), tmp_.data());
    x += tmp_.topRows(T);
    const double total = seconds_since(tm);
    const double router = expert_times_.router_s - before.router_s;
    const double io = expert_times_.expert_io_s - before.expert_io_s;
    times.router_s += router;
    times.expert_io_s += io;
    times.expert_compute_s += total - router - io;  // norm and residual count as compute
  }
}

}  // namespace moestream
