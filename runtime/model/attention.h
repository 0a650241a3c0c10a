// Causal self-attention of one decoder layer with grouped-query heads, QK-norm (per head or over
// all heads), RoPE and a float32 KV cache sized for the model's context at construction.
// gpt-oss: a sliding layer's queries see the last `window` positions only, and its cache keeps
// only window + max_batch - 1 positions (a ring); a per-head sink logit joins each softmax, wo
// adds a bias.
#pragma once

#include <memory>
#include <vector>

#include "runtime/model/dense_ops.h"
#include "loader/format/model_config.h"

namespace moestream {

class Attention {
 public:
  Attention(const ModelConfig& cfg, int max_context, int max_batch);

  // x: T normalised rows [T, D] at positions n_past..n_past+T-1; writes out [T, D] and appends
  // the T keys/values to `layer`'s cache. cos/sin: [T, head_dim/2] from Rope::fill.
  void forward(ThreadPool& pool, int layer, const LayerWeights& w, const float* x, int T,
               int n_past, const float* cos, const float* sin, float* out);

  // Batches (runtime/model/cpu_batch.h) run the projections over every sequence's rows at once:
  // the caller writes this sequence's T projected rows (biases added) to q_rows() [T, H*hd],
  // k_rows() and v_rows() [T, KV*hd], then attend() runs the rest of forward() (QK-norm, RoPE, the
  // cache append, attention) into attn_rows() [T, H*hd], ready for the output projection.
  float* q_rows() { return q_.data(); }
  float* k_rows() { return k_.data(); }
  float* v_rows() { return v_.data(); }
  const float* attn_rows() const { return attn_.data(); }
  void attend(ThreadPool& pool, int layer, const LayerWeights& w, int T, int n_past, const float* cos,
              const float* sin);

  int max_context() const { return max_ctx_; }
  size_t cache_bytes() const;

 private:
  int D_, H_, KV_, hd_, max_ctx_, max_batch_;
  QkNorm qk_norm_;
  float eps_;
  int rot_half_;  // RoPE pairs per head: rotary_dim / 2 (head_dim / 2 but for GLM's partial rotary)
  std::vector<int> window_;    // per layer: keys a query sees (0: all)
  std::vector<int> capacity_;  // per layer: positions its cache holds (max_ctx, or a sliding ring)
  // Per layer: [KV][capacity][hd] so one head's keys are contiguous for the score GEMV.
  std::vector<std::unique_ptr<float[]>> k_cache_, v_cache_;
  RowMatrix q_, k_, v_, attn_;  // [max_batch, H*hd] / [max_batch, KV*hd] scratch
  RowMatrix scores_;            // [H, max_ctx]: one row per head task
};

}  // namespace moestream
