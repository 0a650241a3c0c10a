// Implementation of runtime/gpu/gpu_gqa_attention.h.
#include "runtime/gpu/gpu_gqa_attention.h"

#include <algorithm>
#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

GpuGqaAttention::GpuGqaAttention(CudaForward& f, const std::vector<LayerSpec>& plan)
    : plan_(plan), KV_(f.KV), hd_(f.hd), hd_p_(f.hd_p), max_ctx_(f.opts.max_context) {
  size_t floats = 0;
  for (const LayerSpec& s : plan) {
    int rows = 0;
    if (s.attention.kind == AttentionKind::kGqa) {
      const int window = s.attention.window;
      // A chunk of B tokens reads its first query's window and its own keys: window + B - 1 rows.
      rows = window > 0 ? int(std::min<int64_t>(max_ctx_, int64_t(window) + f.B - 1)) : max_ctx_;
    }
    rows_.push_back(rows);
    offset_.push_back(floats);
    floats += checked_product({2, uint64_t(rows), uint64_t(KV_), uint64_t(hd_p_)}, "--gpu: the KV cache");
  }
  kv_ = DeviceBuffer(floats * sizeof(float));
  if (f.padded) MOE_CUDA_CHECK(cudaMemset(kv_.get(), 0, kv_.bytes()));  // pad columns stay zero
  scratch_ = DeviceBuffer(gpu::attention_scratch_floats(1, f.H, hd_p_, max_ctx_) * sizeof(float));
}

void GpuGqaAttention::append(CudaForward& f, int l, int T, int n_past, const float* k_src, const float* v_src) {
  const int rows = rows_[size_t(l)];
  const int slot0 = n_past % rows, run = std::min(T, rows - slot0);
  const size_t w_b = size_t(hd_) * 4, wp = size_t(hd_p_) * 4, row = size_t(KV_) * hd_p_, src_row = size_t(KV_) * hd_;
  for (int part = 0; part < 2; ++part) {
    float* dst = part == 0 ? keys(l) : values(l);
    const float* src = part == 0 ? k_src : v_src;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(dst + size_t(slot0) * row, wp, src, w_b, w_b, size_t(run) * KV_,
                                     cudaMemcpyDeviceToDevice, f.stream));
    if (run < T)  // the ring wrapped: the rest from row 0
      MOE_CUDA_CHECK(cudaMemcpy2DAsync(dst, wp, src + size_t(run) * src_row, w_b, w_b, size_t(T - run) * KV_,
                                       cudaMemcpyDeviceToDevice, f.stream));
  }
}

// Qwen3's per-head norm with full rotary in one launch (gpu::qk_norm_rope), otherwise rms_norm
// and rope_neox(_partial) launches.
void GpuGqaAttention::norm_and_rope(CudaForward& f, const AttentionSpec& spec, int l, int T, float* k) {
  const GpuLayerWeights& lw = f.w.layers[size_t(l)];
  const int H = f.H, half = f.half, hd = hd_;
  if (spec.qk_norm == QkNorm::kPerHead && 2 * half == hd) {
    gpu::qk_norm_rope(f.qraw, f.kraw, lw.q_norm, lw.k_norm, T, H, KV_, hd, f.eps, f.cos_d, f.sin_d, f.q, k, f.stream);
    return;
  }
  if (spec.qk_norm == QkNorm::kPerHead) {
    gpu::rms_norm(f.qraw, lw.q_norm, T * H, hd, f.eps, f.q, f.stream);
    gpu::rms_norm(f.kraw, lw.k_norm, T * KV_, hd, f.eps, k, f.stream);
  } else if (spec.qk_norm == QkNorm::kFull) {  // OLMoE: over all heads of the token
    gpu::rms_norm(f.qraw, lw.q_norm, T, H * hd, f.eps, f.q, f.stream);
    gpu::rms_norm(f.kraw, lw.k_norm, T, KV_ * hd, f.eps, k, f.stream);
  }
  if (2 * half == hd) {
    gpu::rope_neox(f.q, T, H, half, f.cos_d, f.sin_d, f.stream);
    gpu::rope_neox(k, T, KV_, half, f.cos_d, f.sin_d, f.stream);
  } else {  // GLM's partial rotary: the first 2*half dims of each head
    gpu::rope_neox_partial(f.q, T, H, half, hd, f.cos_d, f.sin_d, f.stream);
    gpu::rope_neox_partial(k, T, KV_, half, hd, f.cos_d, f.sin_d, f.stream);
  }
}

void GpuGqaAttention::layer(CudaForward& f, int l, int T, int n_past) {
  const AttentionSpec& spec = plan_[size_t(l)].attention;
  const bool qk_norm = spec.qk_norm != QkNorm::kNone;
  const GpuLayerWeights& lw = f.w.layers[size_t(l)];
  const int H = f.H, D = f.D;
  float* kc = keys(l);
  float* vc = values(l);
  // A sliding layer's ring (gpt-oss): position p in row p % ring; 0 where rows are positions.
  const int ring = rows_[size_t(l)] < max_ctx_ ? rows_[size_t(l)] : 0;
  // Unpadded heads of a full layer go straight into the cache (position-major: the chunk's rows
  // are contiguous); padded heads and a ring's are built contiguous, then copied (append).
  const bool staged = f.padded || ring > 0;
  float* k_dst = staged ? f.k_tok : kc + size_t(n_past) * KV_ * hd_p_;
  float* v_dst = staged ? f.v_tok : vc + size_t(n_past) * KV_ * hd_p_;
  f.linear_qkv(f.h, lw, T, qk_norm ? f.qraw : f.q, qk_norm ? f.kraw : k_dst, v_dst);
  if (spec.qkv_bias) {  // before QK-norm and RoPE, as the CPU
    f.add_bias(lw.bq, T, H * hd_, qk_norm ? f.qraw : f.q);
    f.add_bias(lw.bk, T, KV_ * hd_, qk_norm ? f.kraw : k_dst);
    f.add_bias(lw.bv, T, KV_ * hd_, v_dst);
  }
  norm_and_rope(f, spec, l, T, k_dst);
  const int window = spec.window;  // gpt-oss: sinks and sliding layers (null / 0 otherwise)
  const float* sinks = spec.sinks ? lw.sinks : nullptr;
  if (staged) append(f, l, T, n_past, k_dst, v_dst);
  float* const scr = T == 1 ? scratch_.as<float>() : nullptr;  // decode: no pool allocation
  const size_t scr_n = T == 1 ? scratch_.bytes() / sizeof(float) : 0;
  if (!f.padded) {
    gpu::attention(f.q, kc, vc, T, n_past, H, KV_, hd_, f.scale, f.attn, f.stream, sinks, window, ring, scr, scr_n);
  } else {
    // Zero pad columns add nothing to q.k or to the weighted sum of v (the test fixtures' odd
    // head_dim; released models have 64 or 128).
    const size_t w_b = size_t(hd_) * 4, wp = size_t(hd_p_) * 4;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(f.q_pad, wp, f.q, w_b, w_b, size_t(T) * H, cudaMemcpyDeviceToDevice, f.stream));
    gpu::attention(f.q_pad, kc, vc, T, n_past, H, KV_, hd_p_, f.scale, f.attn_pad, f.stream, sinks, window, ring,
                   scr, scr_n);
    MOE_CUDA_CHECK(
        cudaMemcpy2DAsync(f.attn, w_b, f.attn_pad, wp, w_b, size_t(T) * H, cudaMemcpyDeviceToDevice, f.stream));
  }
  f.linear(f.attn, lw.wo, T, f.x, true);  // the residual add
  if (spec.o_bias) f.add_bias(lw.bo, T, D, f.x);  // gpt-oss: wo's bias joins the residual too
}

void GpuGqaAttention::prepare_slot(CudaForward& f, int slot) {
  MOE_ASSERT(slot >= 0 && slot < kMaxBatchSlots, "batch slot out of range");
  if (size_t(slot) >= slot_kv_.size()) slot_kv_.resize(size_t(slot) + 1);
  DeviceBuffer& kvs = slot_kv_[size_t(slot)];
  if (kvs.get() != nullptr) return;
  const size_t bytes = plan_.size() * 2 * size_t(max_ctx_) * size_t(KV_) * size_t(hd_p_) * sizeof(float);
  try {
    kvs = DeviceBuffer(bytes);
  } catch (const Error& e) {
    throw ConfigError("--gpu: the KV cache of sequence slot " + std::to_string(slot) + " (" +
                      std::to_string(bytes >> 20) + " MiB for a context of " + std::to_string(max_ctx_) +
                      ") does not fit beside the expert cache; lower --gpu-cache-mb, --ctx or "
                      "--parallel (" + e.what() + ")");
  }
  if (f.padded) MOE_CUDA_CHECK(cudaMemsetAsync(kvs.get(), 0, bytes, f.stream));  // pad columns stay zero
}

// QKV (biases, QK-norm) and RoPE over all rows at once (each row has its own position in the
// cos/sin tables), then per sequence its KV rows written to its slot at its position and attention
// against that slot; o_proj over all rows added to the residual.
void GpuGqaAttention::batch_layer(CudaForward& f, const ForwardBatch& b, int l) {
  const AttentionSpec& spec = plan_[size_t(l)].attention;
  const bool qk_norm = spec.qk_norm != QkNorm::kNone;
  const size_t kv_layer = size_t(max_ctx_) * size_t(KV_) * size_t(hd_p_);
  const GpuLayerWeights& lw = f.w.layers[size_t(l)];
  const int T = f.batch_splits.back(), H = f.H;
  f.linear_qkv(f.h, lw, T, qk_norm ? f.qraw : f.q, qk_norm ? f.kraw : f.k_tok, f.v_tok);
  if (spec.qkv_bias) {  // before QK-norm and RoPE, as the CPU
    f.add_bias(lw.bq, T, H * hd_, qk_norm ? f.qraw : f.q);
    f.add_bias(lw.bk, T, KV_ * hd_, qk_norm ? f.kraw : f.k_tok);
    f.add_bias(lw.bv, T, KV_ * hd_, f.v_tok);
  }
  norm_and_rope(f, spec, l, T, f.k_tok);
  const size_t w_b = size_t(hd_) * 4, wp = size_t(hd_p_) * 4;
  // Zero-padded heads (odd head_dim): the queries once for all rows, the outputs back after.
  if (f.padded)
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(f.q_pad, wp, f.q, w_b, w_b, size_t(T) * H, cudaMemcpyDeviceToDevice, f.stream));
  const int window = spec.window;  // gpt-oss: sinks and sliding layers over the slot's full cache
  const float* sinks = spec.sinks ? lw.sinks : nullptr;
  for (int i = 0; i < b.n_entries; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    const size_t r0 = size_t(f.batch_splits[size_t(i)]);
    float* kc = slot_kv(b.entries[i].slot) + size_t(2 * l) * kv_layer;
    float* vc = kc + kv_layer;
    float* k_new = kc + size_t(c.n_past) * KV_ * hd_p_;
    float* v_new = vc + size_t(c.n_past) * KV_ * hd_p_;
    const size_t heads = size_t(c.n_tokens) * KV_;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(k_new, wp, f.k_tok + r0 * KV_ * hd_, w_b, w_b, heads, cudaMemcpyDeviceToDevice,
                                     f.stream));
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(v_new, wp, f.v_tok + r0 * KV_ * hd_, w_b, w_b, heads, cudaMemcpyDeviceToDevice,
                                     f.stream));
    const float* qi = f.padded ? f.q_pad + r0 * H * hd_p_ : f.q + r0 * H * hd_;
    float* oi = f.padded ? f.attn_pad + r0 * H * hd_p_ : f.attn + r0 * H * hd_;
    gpu::attention(qi, kc, vc, c.n_tokens, c.n_past, H, KV_, hd_p_, f.scale, oi, f.stream, sinks, window);
  }
  if (f.padded)
    MOE_CUDA_CHECK(
        cudaMemcpy2DAsync(f.attn, w_b, f.attn_pad, wp, w_b, size_t(T) * H, cudaMemcpyDeviceToDevice, f.stream));
  f.linear(f.attn, lw.wo, T, f.x, true);  // the residual add
  if (spec.o_bias) f.add_bias(lw.bo, T, f.D, f.x);
}

// The projections are warmed by CudaForward::warm_up (which names each matrix); here the
// attention kernels of the first GQA layer's kind, on the cache's first rows.
void GpuGqaAttention::warm_up(CudaForward& f, int T) {
  for (size_t l = 0; l < plan_.size(); ++l) {
    if (plan_[l].attention.kind != AttentionKind::kGqa) continue;
    norm_and_rope(f, plan_[l].attention, int(l), T, f.k_tok);  // Qwen3's fused QK-norm + RoPE among them
    gpu::attention(f.padded ? f.q_pad : f.q, kv_.as<float>(), kv_.as<float>(), T, 0, f.H, KV_, hd_p_, f.scale,
                   f.padded ? f.attn_pad : f.attn, f.stream);
    return;
  }
}

}  // namespace moestream::detail
