// Implementation of runtime/model/attention.h. Work is split per head: each task owns one score row,
// so the step allocates nothing.
#include "runtime/model/attention.h"

#include <algorithm>
#include <cmath>

#include "common/checked.h"
#include "common/error.h"
#include "common/option_ref.h"
#include "runtime/model/rope.h"

namespace moestream {

Attention::Attention(const ModelConfig& cfg, int max_context, int max_batch)
    : D_(cfg.hidden_size), H_(cfg.n_heads), KV_(cfg.n_kv_heads), hd_(cfg.head_dim),
      max_ctx_(max_context), max_batch_(max_batch), qk_norm_(cfg.qk_norm),
      eps_(static_cast<float>(cfg.rms_norm_eps)), rot_half_(cfg.rope_dim() / 2) {
  if (KV_ <= 0 || H_ % KV_ != 0)
    throw ConfigError("model.json: n_heads (" + std::to_string(H_) +
                      ") must be a multiple of n_kv_heads (" + std::to_string(KV_) + ")");
  const std::string source = "the context length " + std::to_string(max_ctx_) +
                             " (" + option_ref("ctx") + ") and model.json's n_layers x n_kv_heads x head_dim";
  // A sliding layer (gpt-oss) keeps only the positions a chunk can still see: its window plus
  // the chunk's other tokens, as a ring (position p in slot p % capacity).
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int w = cfg.window_of(l);
    window_.push_back(w);
    capacity_.push_back(w > 0 ? int(std::min<int64_t>(max_ctx_, int64_t(w) + max_batch_ - 1)) : max_ctx_);
  }
  const size_t per_layer = checked_product({uint64_t(KV_), uint64_t(max_ctx_), uint64_t(hd_)}, "the KV cache of " + source);
  const uint64_t total_bytes = checked_product({2, uint64_t(cfg.n_layers), per_layer, sizeof(float)}, "the KV cache of " + source);
  allocating("the KV cache", total_bytes, source, [&] {
    for (int l = 0; l < cfg.n_layers; ++l) {
      // new float[] leaves pages untouched until a position is written: a long --ctx costs
      // address space, not RAM, until used.
      const size_t n = size_t(KV_) * size_t(capacity_[size_t(l)]) * size_t(hd_);  // <= per_layer
      k_cache_.emplace_back(new float[n]);
      v_cache_.emplace_back(new float[n]);
    }
  });
  q_.resize(max_batch_, H_ * hd_);
  attn_.resize(max_batch_, H_ * hd_);
  k_.resize(max_batch_, KV_ * hd_);
  v_.resize(max_batch_, KV_ * hd_);
  scores_.resize(H_, max_ctx_);
}

size_t Attention::cache_bytes() const {
  size_t n = 0;
  for (int c : capacity_) n += 2 * size_t(KV_) * size_t(c) * size_t(hd_) * sizeof(float);
  return n;
}

void Attention::forward(ThreadPool& pool, int layer, const LayerWeights& w, const float* x, int T,
                        int n_past, const float* cos, const float* sin, float* out) {
  MOE_ASSERT(T > 0 && T <= max_batch_ && n_past + T <= max_ctx_);
  ConstRowMap xm(x, T, D_);
  RowMap q(q_.data(), T, H_ * hd_), k(k_.data(), T, KV_ * hd_), v(v_.data(), T, KV_ * hd_);
  const DenseMatrix* ws[3] = {&w.wq, &w.wk, &w.wv};
  RowMap* ys[3] = {&q, &k, &v};
  linear_group(pool, xm, ws, ys);
  if (w.bq.size() > 0) {  // Qwen2-MoE's projection biases, before QK-norm and RoPE as in transformers
    q.rowwise() += w.bq.transpose();
    k.rowwise() += w.bk.transpose();
    v.rowwise() += w.bv.transpose();
  }
  attend(pool, layer, w, T, n_past, cos, sin);
  RowMap om(out, T, D_);
  linear(pool, ConstRowMap(attn_.data(), T, H_ * hd_), w.wo, om);
  if (w.bo.size() > 0) om.rowwise() += w.bo.transpose();
}

void Attention::attend(ThreadPool& pool, int layer, const LayerWeights& w, int T, int n_past,
                       const float* cos, const float* sin) {
  MOE_ASSERT(T > 0 && T <= max_batch_ && n_past + T <= max_ctx_);
  RowMap q(q_.data(), T, H_ * hd_), k(k_.data(), T, KV_ * hd_), v(v_.data(), T, KV_ * hd_);
  const int half = rot_half_;  // the cos/sin tables' stride; dims past 2*half pass unrotated
  const int cap = capacity_[size_t(layer)];
  float* kc = k_cache_[static_cast<size_t>(layer)].get();
  float* vc = v_cache_[static_cast<size_t>(layer)].get();
  // QK-norm, RoPE and the cache append, per token (cheap next to the projections).
  for (int t = 0; t < T; ++t) {
    float* qt = q.row(t).data();
    float* kt = k.row(t).data();
    if (qk_norm_ == QkNorm::kFull) {  // OLMoE: one RMSNorm over all heads, before the split
      rms_norm(qt, w.q_norm.data(), H_ * hd_, eps_, qt);
      rms_norm(kt, w.k_norm.data(), KV_ * hd_, eps_, kt);
    }
    const float* ct = cos + size_t(t) * half;
    const float* st = sin + size_t(t) * half;
    for (int h = 0; h < H_; ++h) {
      float* qh = qt + size_t(h) * hd_;
      if (qk_norm_ == QkNorm::kPerHead) rms_norm(qh, w.q_norm.data(), hd_, eps_, qh);
      Rope::apply(qh, ct, st, half);
    }
    const size_t pos = size_t(n_past + t);
    for (int g = 0; g < KV_; ++g) {
      float* kh = kt + size_t(g) * hd_;
      if (qk_norm_ == QkNorm::kPerHead) rms_norm(kh, w.k_norm.data(), hd_, eps_, kh);
      Rope::apply(kh, ct, st, half);
      const size_t base = (size_t(g) * cap + pos % size_t(cap)) * hd_;
      std::copy(kh, kh + hd_, kc + base);
      const float* vh = v.row(t).data() + size_t(g) * hd_;
      std::copy(vh, vh + hd_, vc + base);
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  const int group = H_ / KV_;
  RowMap attn(attn_.data(), T, H_ * hd_);
  const int window = window_[size_t(layer)];
  const bool sinks = w.sinks.size() > 0;
  pool.parallel_for(static_cast<size_t>(H_), [&](size_t hi) {
    const int h = static_cast<int>(hi), g = h / group;
    ConstRowMap K(kc + size_t(g) * cap * hd_, cap, hd_);
    ConstRowMap V(vc + size_t(g) * cap * hd_, cap, hd_);
    auto s_row = scores_.row(h);
    for (int t = 0; t < T; ++t) {
      const int end = n_past + t + 1;  // causal: keys up to this token's own position
      // A sliding layer: the last `window` positions, this one included (transformers' mask).
      const int first = window > 0 ? std::max(0, end - window) : 0;
      const int len = end - first;
      auto s = s_row.head(len);
      auto qh = q.row(t).segment(Eigen::Index(h) * hd_, hd_);
      // Keys [first, end) in cache slots: one run, or two where a sliding layer's ring wraps.
      const int slot0 = first % cap, run = std::min(len, cap - slot0);
      s.head(run).transpose().noalias() = K.middleRows(slot0, run) * qh.transpose();
      if (run < len) s.tail(len - run).transpose().noalias() = K.topRows(len - run) * qh.transpose();
      s *= scale;
      // gpt-oss's sink: one more logit in the softmax that attends to nothing.
      const float sink = sinks ? w.sinks[h] : 0.0f;
      const float m = sinks ? std::max(s.maxCoeff(), sink) : s.maxCoeff();
      s = (s.array() - m).exp();
      s /= s.sum() + (sinks ? std::exp(sink - m) : 0.0f);
      auto o = attn.row(t).segment(Eigen::Index(h) * hd_, hd_);
      o.noalias() = s.head(run) * V.middleRows(slot0, run);
      if (run < len) o.noalias() += s.tail(len - run) * V.topRows(len - run);
    }
  });
}

}  // namespace moestream
