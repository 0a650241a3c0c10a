// Internal to runtime/gpu/gpu_forward*.cpp: DeepSeek-V2/V3 (Kimi K2) multi-head latent attention
// on the GPU, the device twin of runtime/model/mla_attention.h (docs/mla.md, docs/gpu.md). Holds
// the compressed KV cache (per layer and position the normalised kv_lora_rank latent and the
// rotated qk_rope_head_dim key shared by every head, float32) and the layer's scratch; the
// projections go through CudaForward::linear in their stored types, the rest through
// kernels/cuda/mla_ops.h. Every chunk, prefill and decode, uses the absorbed form.
#pragma once

#include <string>

#include "loader/format/model_config.h"
#include "runtime/gpu/gpu_attention.h"
#include "runtime/gpu/gpu_weights.h"

namespace moestream::detail {

struct CudaForward;

class GpuMla final : public GpuAttention {
 public:
  // Allocates the latent cache for max_context positions of every layer and the scratch of
  // max_batch tokens; ConfigError when a dimension is outside what the kernels take.
  GpuMla(const ModelConfig& cfg, const GpuDenseWeights& w, int max_context, int max_batch);

  // Layer l's attention for the chunk's T normalised rows in f.h at positions n_past..: the
  // latent rows appended to the cache, wo . o added to the residual f.x (all on f.stream, no
  // host sync, so resident decode runs it too).
  void layer(CudaForward& f, int l, int T, int n_past) override;
  // Batches of sequences need a latent state per slot, which the GPU pass does not keep:
  // ConfigError (Model::create refuses `parallel` with `gpu` on an MLA model first).
  void batch_layer(CudaForward& f, const ForwardBatch& b, int l) override;
  void prepare_slot(CudaForward& f, int slot) override;
  // Every layer's matrices and kernels once on T scratch rows (positions 0..T-1 of the cache,
  // rewritten before any forward reads them); a matrix type the kernels do not take is a
  // ConfigError naming the layer and tensor.
  void warm_up(CudaForward& f, int T) override;

  size_t state_bytes() const override { return cache_.bytes(); }
  size_t scratch_bytes() const override { return act_.bytes() + wkv_b_f32_.bytes() + row_ids_.bytes(); }
  // The widest input of an MLA projection (the caller's rounding scratch covers it).
  static int max_input_width(const ModelConfig& cfg);

 private:
  // wkv_b of layer l as the kernels read it: in place when mla_reads_type, else dequantised into
  // wkv_b_f32_ (enqueued on the stream).
  const uint8_t* wkv_b_of(CudaForward& f, const GpuMatrix& m, QuantType* type);

  int H_, Q_, C_, n_, r_, v_, lat_, max_ctx_, max_batch_;
  float eps_, scale_;
  DeviceBuffer cache_;  // [n_layers][max_ctx][C + r]
  DeviceBuffer act_;
  float *qa_ = nullptr, *qa_n_ = nullptr, *q_ = nullptr, *kva_ = nullptr, *q_abs_ = nullptr, *ctx_ = nullptr,
        *o_ = nullptr, *partial_ = nullptr;
  DeviceBuffer wkv_b_f32_;  // [H (n + v), C]: only when some layer's wkv_b is a block type (a GGUF)
  DeviceBuffer row_ids_;    // [H (n + v)]: 0, 1, ... for dequantize_rows
};

}  // namespace moestream::detail
