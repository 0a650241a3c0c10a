// Implementation of runtime/gpu/gpu_mla.h: the steps of MlaAttention (one sequence)
// (runtime/model/mla_attention.cpp) on the forward pass's stream, in the same order and with the
// same constants (softmax scale with YaRN's mscale, the RoPE tables of Rope::fill).
#include "runtime/gpu/gpu_mla.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/mla_ops.h"
#include "runtime/gpu/gpu_forward_impl.h"
#include "runtime/model/mla_attention.h"

namespace moestream::detail {

int GpuMla::max_input_width(const ModelConfig& cfg) {
  return cfg.has_mla() ? std::max(cfg.q_lora_rank, cfg.n_heads * cfg.v_head_dim) : 0;
}

GpuMla::GpuMla(const ModelConfig& cfg, const GpuDenseWeights& w, int max_context, int max_batch)
    : H_(cfg.n_heads), Q_(cfg.q_lora_rank), C_(cfg.kv_lora_rank), n_(cfg.qk_nope_head_dim), r_(cfg.qk_rope_head_dim),
      v_(cfg.v_head_dim), lat_(cfg.kv_lora_rank + cfg.qk_rope_head_dim), max_ctx_(max_context),
      max_batch_(max_batch), eps_(float(cfg.rms_norm_eps)), scale_(mla_softmax_scale(cfg)) {
  if (r_ <= 0 || r_ % 2 != 0 || n_ <= 0 || v_ <= 0 || C_ <= 0 || Q_ < 0 || lat_ > gpu::kMlaMaxLatent ||
      n_ > gpu::kMlaMaxLatent)
    throw ConfigError("--gpu: MLA dimensions kv_lora_rank " + std::to_string(C_) + ", qk_rope_head_dim " +
                      std::to_string(r_) + ", qk_nope_head_dim " + std::to_string(n_) + ", v_head_dim " +
                      std::to_string(v_) + " are outside what the GPU kernels take (rope even, kv_lora_rank + "
                      "qk_rope_head_dim and qk_nope_head_dim at most " + std::to_string(gpu::kMlaMaxLatent) + ")");
  cache_ = DeviceBuffer(size_t(cfg.n_layers) * size_t(max_ctx_) * size_t(lat_) * sizeof(float));
  const size_t b = size_t(max_batch_);
  const size_t n_floats[] = {b * size_t(Q_), b * size_t(Q_), b * size_t(H_) * size_t(n_ + r_), b * size_t(lat_),
                             b * size_t(H_) * size_t(lat_), b * size_t(H_) * size_t(C_), b * size_t(H_) * size_t(v_),
                             gpu::mla_attention_partial_floats(max_batch_, H_, C_)};
  float** dst[] = {&qa_, &qa_n_, &q_, &kva_, &q_abs_, &ctx_, &o_, &partial_};
  size_t total = 0;
  for (size_t n : n_floats) total += (n + 63) / 64 * 64;  // 256-byte aligned arrays (dense_gemm's inputs)
  act_ = DeviceBuffer(total * sizeof(float));
  float* p = act_.as<float>();
  for (size_t i = 0; i < std::size(n_floats); ++i) {
    *dst[i] = p;
    p += (n_floats[i] + 63) / 64 * 64;
  }
  // A GGUF's wkv_b may be a block type: it is then dequantised per call into one layer-sized
  // float32 scratch (never a float copy of every layer).
  bool any_block_type = false;
  for (const GpuLayerWeights& lw : w.layers) any_block_type |= !gpu::mla_reads_type(lw.wkv_b.type);
  if (any_block_type) {
    const int rows = H_ * (n_ + v_);
    wkv_b_f32_ = DeviceBuffer(size_t(rows) * size_t(C_) * sizeof(float));
    std::vector<int> ids(static_cast<size_t>(rows));
    std::iota(ids.begin(), ids.end(), 0);
    row_ids_ = DeviceBuffer(ids.size() * sizeof(int));
    MOE_CUDA_CHECK(cudaMemcpy(row_ids_.get(), ids.data(), row_ids_.bytes(), cudaMemcpyHostToDevice));
  }
}

const uint8_t* GpuMla::wkv_b_of(CudaForward& f, const GpuMatrix& m, QuantType* type) {
  if (gpu::mla_reads_type(m.type)) {
    *type = m.type;
    return m.data;
  }
  gpu::dequantize_rows(m.type, m.data, C_, row_ids_.as<int>(), m.rows, wkv_b_f32_.as<float>(), f.stream);
  *type = QuantType::kF32;
  return wkv_b_f32_.as<uint8_t>();
}

void GpuMla::layer(CudaForward& f, int l, int T, int n_past) {
  MOE_ASSERT(T > 0 && T <= max_batch_ && n_past >= 0 && n_past + T <= max_ctx_);
  const GpuLayerWeights& lw = f.w.layers[size_t(l)];
  MOE_ASSERT(lw.wkv_b.rows == H_ * (n_ + v_) && lw.wkv_b.cols == C_ && f.half * 2 == r_);
  // Query: q LoRA down-projection, its RMSNorm, up-projection (or V2's plain wq).
  if (Q_ > 0) {
    f.linear(f.h, lw.wq_a, T, qa_);
    gpu::rms_norm(qa_, lw.q_a_norm, T, Q_, eps_, qa_n_, f.stream);
    f.linear(qa_n_, lw.wq_b, T, q_);
  } else {
    f.linear(f.h, lw.wq, T, q_);
  }
  // The latent and the shared RoPE key, normalised and rotated into the cache rows n_past...
  f.linear(f.h, lw.wkv_a, T, kva_);
  float* cache = cache_.as<float>() + size_t(l) * size_t(max_ctx_) * size_t(lat_);
  gpu::mla_cache_append(kva_, lw.kv_a_norm, eps_, f.cos_d, f.sin_d, T, C_, r_, cache + size_t(n_past) * lat_,
                        f.stream);
  // Absorbed: W_UK folded into the query, attention over the latents, W_UV after the weighted sum.
  QuantType wt = QuantType::kF32;
  const uint8_t* wkv_b = wkv_b_of(f, lw.wkv_b, &wt);
  gpu::mla_absorb_q(q_, wt, wkv_b, T, H_, n_, r_, v_, C_, f.cos_d, f.sin_d, q_abs_, f.stream);
  gpu::mla_attention(q_abs_, cache, T, n_past, H_, C_, r_, scale_, partial_, ctx_, f.stream);
  gpu::mla_value_out(ctx_, wt, wkv_b, T, H_, n_, v_, C_, o_, f.stream);
  f.linear(o_, lw.wo, T, f.x, true);  // the residual add
}

void GpuMla::warm_up(CudaForward& f, int T) {
  for (int l = 0; l < int(f.w.layers.size()); ++l) {
    const GpuLayerWeights& lw = f.w.layers[size_t(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    auto named = [&](const std::string& what, QuantType q, auto&& launch) {
      try {
        launch();
      } catch (const ConfigError& e) {
        throw ConfigError("--gpu: " + p + what + " (" + std::string(quant_name(q)) + "): " + e.what());
      }
    };
    if (Q_ > 0) {
      named("wq_a", lw.wq_a.type, [&] { f.linear(f.h, lw.wq_a, T, qa_); });
      named("wq_b", lw.wq_b.type, [&] { f.linear(qa_n_, lw.wq_b, T, q_); });
    } else {
      named("wq", lw.wq.type, [&] { f.linear(f.h, lw.wq, T, q_); });
    }
    named("wkv_a", lw.wkv_a.type, [&] { f.linear(f.h, lw.wkv_a, T, kva_); });
    named("wo", lw.wo.type, [&] { f.linear(o_, lw.wo, T, f.x, true); });
    named("wkv_b", lw.wkv_b.type, [&] { layer(f, l, T, 0); });
  }
}

namespace {
[[noreturn]] void refuse_batches() {
  throw ConfigError("--gpu: batches of sequences (--parallel) run standard attention on the GPU; MLA batches run on "
                    "the CPU path (drop --gpu)");
}
}  // namespace

void GpuMla::batch_layer(CudaForward&, const ForwardBatch&, int) { refuse_batches(); }
void GpuMla::prepare_slot(CudaForward&, int) { refuse_batches(); }

}  // namespace moestream::detail
