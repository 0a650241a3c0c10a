// Grouped-query attention of one decoder layer (AttentionKind::kGqa) on the CPU: q/k/v
// projections (with biases when the layer has them), QK-norm per head or over all heads, RoPE
// (partial for GLM's rotary_dim), a float32 KV cache per sequence sized for the context.
// gpt-oss: a sliding layer's queries see the last `window` positions only, and its cache keeps
// only window + max_batch - 1 positions (a ring); a per-head sink logit joins each softmax, wo
// adds a bias.
#pragma once

#include <memory>
#include <vector>

#include "loader/format/model_config.h"
#include "runtime/model/blocks.h"
#include "runtime/model/dense_ops.h"
#include "runtime/model/layer_plan.h"

namespace moestream {

// Scratch every GQA layer of a pass shares (one layer runs at a time). allocate() sizes it (after
// the states: a context too long for memory then fails naming the KV cache first); ConfigError
// naming the context when it does not fit.
struct GqaScratch {
  GqaScratch(const ModelConfig& cfg, int max_context, int max_batch)
      : cfg(cfg), max_context(max_context), max_batch(max_batch) {}
  void allocate();
  const ModelConfig& cfg;
  int max_context, max_batch;
  RowMatrix q, k, v, attn;                  // the step's rows: [max_batch, H*hd] / [max_batch, KV*hd]
  RowMatrix seq_q, seq_k, seq_v, seq_attn;  // one sequence's rows at an aligned start, as alone
  RowMatrix scores;                         // [H, max_ctx]: one row per head task
};

// The KV cache of the context length (`ctx`): throws ConfigError when n_layers of them
// cannot be sized (an overflow), naming the context and model.json's shape.
void check_kv_cache_size(const ModelConfig& cfg, int max_context);

class GqaAttention final : public AttentionBlock {
 public:
  GqaAttention(const ModelConfig& cfg, const AttentionSpec& spec, GqaScratch& scratch, int max_context,
               int max_batch);

  // Projections once over every row (each sequence's as its run alone computes them), then each
  // sequence's attention against its own cache, then the output projection.
  void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) override;
  void prepare(int state) override;
  size_t state_bytes() const override;

 private:
  struct Kv {
    std::unique_ptr<float[]> k, v;  // [KV][capacity][hd]: one head's keys contiguous for the score GEMV
  };
  // QK-norm, RoPE, the cache append and attention of one sequence's T rows in q/k/v -> attn.
  void attend(ThreadPool& pool, const LayerWeights& w, Kv& kv, int T, int n_past, const float* cos,
              const float* sin, RowMatrix& q, RowMatrix& k, RowMatrix& v, RowMatrix& attn);

  AttentionSpec spec_;
  GqaScratch& s_;
  int D_, H_, KV_, hd_, max_ctx_, max_batch_;
  float eps_;
  int rot_half_;  // RoPE pairs per head: rotary_dim / 2 (head_dim / 2 but for GLM's partial rotary)
  int capacity_;  // positions a state holds: max_ctx, or a sliding layer's ring
  std::vector<Kv> states_;  // by state index; empty until prepared
};

}  // namespace moestream
