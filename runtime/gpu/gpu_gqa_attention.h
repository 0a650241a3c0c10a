// Internal to runtime/gpu: grouped-query attention on the GPU (AttentionKind::kGqa), the device
// twin of runtime/model/attention.h: q/k/v through CudaForward's products (biases, QK-norm, RoPE
// per the layer's AttentionSpec), the keys and values appended to the layer's float32 KV cache,
// gpu::attention (sinks, sliding window), the output projection added to the residual.
// The pass's own sequence keeps, per layer, max_context positions, or a ring of window +
// max_batch - 1 for a sliding layer (position p in row p % rows; issue 21), so device memory does
// not grow with the context; a batch slot keeps max_context positions of every layer, allocated
// on its first use and kept for the slot's next sequence (outside the expert cache's budget: the
// automatic budget leaves 20% of the free VRAM for this and the like).
#pragma once

#include <vector>

#include "runtime/gpu/gpu_attention.h"
#include "runtime/gpu/gpu_weights.h"
#include "runtime/model/layer_plan.h"

namespace moestream::detail {

class GpuGqaAttention final : public GpuAttention {
 public:
  // Allocates the pass's own KV cache for the layers `plan` gives GQA (others get none).
  GpuGqaAttention(CudaForward& f, const std::vector<LayerSpec>& plan);

  void layer(CudaForward& f, int l, int T, int n_past) override;
  void batch_layer(CudaForward& f, const ForwardBatch& b, int l) override;
  void prepare_slot(CudaForward& f, int slot) override;
  void warm_up(CudaForward& f, int T) override;
  size_t state_bytes() const override { return kv_.bytes(); }
  size_t scratch_bytes() const override { return scratch_.bytes(); }

 private:
  float* keys(int l) { return kv_.as<float>() + offset_[size_t(l)]; }
  float* values(int l) { return keys(l) + size_t(rows_[size_t(l)]) * KV_ * hd_p_; }
  // The chunk's T rows of k and v ([T, KV, hd], contiguous) into layer l's cache at positions
  // n_past..: one copy, or two where a ring wraps; rows are padded to hd_p.
  void append(CudaForward& f, int l, int T, int n_past, const float* k_src, const float* v_src);
  // QK-norm (when the layer has it) and RoPE of f's q (qraw -> q, or in place) and k (kraw -> k).
  void norm_and_rope(CudaForward& f, const AttentionSpec& spec, int l, int T, float* k);
  float* slot_kv(int slot) { return slot_kv_[size_t(slot)].as<float>(); }

  const std::vector<LayerSpec>& plan_;
  int KV_, hd_, hd_p_, max_ctx_;
  DeviceBuffer kv_;              // per layer: K then V, [rows_[l]][KV][hd_p] each
  std::vector<int> rows_;        // positions layer l's cache keeps (0: not a GQA layer)
  std::vector<size_t> offset_;   // its offset in kv_ (floats)
  std::vector<DeviceBuffer> slot_kv_;  // by batch slot: [n_layers][2][max_ctx][KV][hd_p]
  // Split-context partials of a decode token's attention (gpu::attention's scratch), so that no
  // step allocates from the stream-ordered pool (a captured allocation defeats graph updates).
  DeviceBuffer scratch_;
};

}  // namespace moestream::detail
