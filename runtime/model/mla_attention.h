// DeepSeek-V2/V3 multi-head latent attention (MLA) of one decoder layer on the CPU, with the
// compressed KV cache: per position and layer only the normalised kv_lora_rank latent and the
// qk_rope_head_dim RoPE key shared by all heads, never per-head keys and values.
#pragma once

#include <memory>
#include <vector>

#include "loader/format/model_config.h"
#include "runtime/model/blocks.h"
#include "runtime/model/dense_ops.h"

namespace moestream {

// The softmax scale of MLA: 1/sqrt(qk_nope + qk_rope), times mscale(factor, mscale_all_dim)^2
// under YaRN scaling that sets mscale_all_dim (transformers' DeepseekV3Attention).
float mla_softmax_scale(const ModelConfig& cfg);

// Floats one position of one layer holds in the latent cache: kv_lora_rank + qk_rope_head_dim.
size_t mla_cache_floats_per_token(const ModelConfig& cfg);

// Scratch every MLA layer of a pass shares (one layer runs at a time); allocate() sizes it, after
// the states, as GqaScratch.
struct MlaScratch {
  MlaScratch(const ModelConfig& cfg, int max_context, int max_batch)
      : cfg(cfg), max_context(max_context), max_batch(max_batch) {}
  void allocate();
  const ModelConfig& cfg;
  int max_context, max_batch;
  RowMatrix qa, q, kva;  // [max_batch, Q], [max_batch, H*(n+r)], [max_batch, C+r]
  RowMatrix q_abs;       // [max_batch, H*(C+r)]: per head the absorbed query and its RoPE part
  RowMatrix ctx;         // [max_batch, H*C]: per head the attention-weighted latent
  RowMatrix o;           // [max_batch, H*v]
  RowMatrix scores;      // [H, max_ctx]
  RowMatrix row_buf;     // [H, C]: one decoded wkv_b row per head task
  RowMatrix in, out;     // [max_batch, D]: one sequence's rows of a batch at an aligned start

 private:
  void allocate_now();
};

// The latent KV cache of the context length: throws ConfigError when n_layers of them cannot be
// sized, naming the context and model.json's shape.
void check_latent_cache_size(const ModelConfig& cfg, int max_context);

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(const ModelConfig& cfg, MlaScratch& scratch, int max_context, int max_batch);

  // Each sequence alone (its products at an aligned start, as its run alone has them). Every step
  // uses the absorbed projections: each head's key up-projection W_UK is folded into its query
  // (q_nope W_UK scores against the latents directly) and the value up-projection W_UV is
  // applied once to the attention-weighted latent, so no position's keys or values are ever
  // expanded.
  void forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) override;
  void prepare(int state) override;
  size_t state_bytes() const override;

 private:
  // One sequence: x [T, D] normalised rows at positions n_past.., out [T, D]; cos/sin
  // [T, qk_rope_head_dim/2].
  void sequence(ThreadPool& pool, const LayerWeights& w, float* cache, const float* x, int T, int n_past,
                const float* cos, const float* sin, float* out);

  MlaScratch& s_;
  int D_, H_, Q_, C_, n_, r_, v_;  // hidden, heads, q_lora_rank, kv_lora_rank, nope, rope, v dims
  int max_ctx_, max_batch_;
  float eps_, scale_;
  // By state index: [max_ctx][C + r], the latent then the rotated shared key of each position.
  std::vector<std::unique_ptr<float[]>> states_;
};

}  // namespace moestream
