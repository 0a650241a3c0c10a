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

namespace {
std::string kv_source(int max_context) {
  return "the context length " + std::to_string(max_context) +
         " (" + option_ref("ctx") + ") and model.json's n_layers x n_kv_heads x head_dim";
}
}  // namespace

void GqaScratch::allocate() {
  const int Q = cfg.n_heads * cfg.head_dim, KV = cfg.n_kv_heads * cfg.head_dim;
  const uint64_t bytes = sizeof(float) * (uint64_t(cfg.n_heads) * uint64_t(max_context) +
                                          4 * uint64_t(max_batch) * uint64_t(Q + KV));
  allocating("the attention scratch", bytes, kv_source(max_context), [&] {
    for (RowMatrix* m : {&q, &attn, &seq_q, &seq_attn}) m->resize(max_batch, Q);
    for (RowMatrix* m : {&k, &v, &seq_k, &seq_v}) m->resize(max_batch, KV);
    scores.resize(cfg.n_heads, max_context);
  });
}

void check_kv_cache_size(const ModelConfig& cfg, int max_context) {
  const std::string source = kv_source(max_context);
  const uint64_t per_layer = checked_product(
      {uint64_t(cfg.n_kv_heads), uint64_t(max_context), uint64_t(cfg.head_dim)}, "the KV cache of " + source);
  checked_product({2, uint64_t(cfg.n_layers), per_layer, sizeof(float)}, "the KV cache of " + source);
}

GqaAttention::GqaAttention(const ModelConfig& cfg, const AttentionSpec& spec, GqaScratch& scratch,
                           int max_context, int max_batch)
    : spec_(spec), s_(scratch), D_(cfg.hidden_size), H_(cfg.n_heads), KV_(cfg.n_kv_heads), hd_(cfg.head_dim),
      max_ctx_(max_context), max_batch_(max_batch), eps_(static_cast<float>(cfg.rms_norm_eps)),
      rot_half_(cfg.rope_dim() / 2) {
  if (KV_ <= 0 || H_ % KV_ != 0)
    throw ConfigError("model.json: n_heads (" + std::to_string(H_) +
                      ") must be a multiple of n_kv_heads (" + std::to_string(KV_) + ")");
  check_kv_cache_size(cfg, max_context);
  // A sliding layer (gpt-oss) keeps only the positions a chunk can still see: its window plus
  // the chunk's other tokens, as a ring (position p in slot p % capacity).
  const int w = spec.window;
  capacity_ = w > 0 ? int(std::min<int64_t>(max_ctx_, int64_t(w) + max_batch_ - 1)) : max_ctx_;
}

void GqaAttention::prepare(int state) {
  MOE_ASSERT(state >= 0, "state index");
  if (size_t(state) >= states_.size()) states_.resize(size_t(state) + 1);
  Kv& kv = states_[size_t(state)];
  if (kv.k) return;
  const size_t n = size_t(KV_) * size_t(capacity_) * size_t(hd_);
  allocating("the KV cache", 2 * n * sizeof(float), kv_source(max_ctx_), [&] {
    // new float[] leaves pages untouched until a position is written: a long `ctx` costs
    // address space, not RAM, until used.
    kv.k.reset(new float[n]);
    kv.v.reset(new float[n]);
  });
}

size_t GqaAttention::state_bytes() const {
  size_t n = 0;
  for (const Kv& kv : states_)
    if (kv.k) n += 2 * size_t(KV_) * size_t(capacity_) * size_t(hd_) * sizeof(float);
  return n;
}

void GqaAttention::forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) {
  const int T = step.T, Q = H_ * hd_, KVd = KV_ * hd_;
  MOE_ASSERT(T > 0 && T <= max_batch_);
  ThreadPool& pool = step.pool;
  const ConstRowMap hm(h, T, D_);
  RowMap q(s_.q.data(), T, Q), k(s_.k.data(), T, KVd), v(s_.v.data(), T, KVd), a(s_.attn.data(), T, Q);
  const DenseMatrix* ws[3] = {&w.wq, &w.wk, &w.wv};
  RowMap* ys[3] = {&q, &k, &v};
  linear_group_ranges(pool, hm, ws, ys, step.splits);
  if (spec_.qkv_bias) {  // before QK-norm and RoPE, as in transformers
    q.rowwise() += w.bq.transpose();
    k.rowwise() += w.bk.transpose();
    v.rowwise() += w.bv.transpose();
  }
  const int half = rot_half_;
  for (const StepSequence& sq : step.sequences) {  // each against its own cache
    MOE_ASSERT(sq.n_past + sq.n_tokens <= max_ctx_ && size_t(sq.state) < states_.size() &&
               states_[size_t(sq.state)].k, "attention state not prepared");
    Kv& kv = states_[size_t(sq.state)];
    const float* cos = step.cos + size_t(sq.row0) * half;
    const float* sin = step.sin + size_t(sq.row0) * half;
    const int r0 = sq.row0, n = sq.n_tokens;
    if (r0 == 0) {  // at the start of the scratch already, as its run alone has it
      attend(pool, w, kv, n, sq.n_past, cos, sin, s_.q, s_.k, s_.v, s_.attn);
      continue;
    }
    RowMap(s_.seq_q.data(), n, Q) = q.middleRows(r0, n);
    RowMap(s_.seq_k.data(), n, KVd) = k.middleRows(r0, n);
    RowMap(s_.seq_v.data(), n, KVd) = v.middleRows(r0, n);
    attend(pool, w, kv, n, sq.n_past, cos, sin, s_.seq_q, s_.seq_k, s_.seq_v, s_.seq_attn);
    a.middleRows(r0, n) = ConstRowMap(s_.seq_attn.data(), n, Q);
  }
  RowMap om(out, T, D_);
  linear_ranges(pool, ConstRowMap(s_.attn.data(), T, Q), w.wo, om, step.splits);
  if (spec_.o_bias) om.rowwise() += w.bo.transpose();
}

void GqaAttention::attend(ThreadPool& pool, const LayerWeights& w, Kv& kv, int T, int n_past, const float* cos,
                          const float* sin, RowMatrix& q_rows, RowMatrix& k_rows, RowMatrix& v_rows,
                          RowMatrix& attn_rows) {
  RowMap q(q_rows.data(), T, H_ * hd_), k(k_rows.data(), T, KV_ * hd_), v(v_rows.data(), T, KV_ * hd_);
  const int half = rot_half_;  // the cos/sin tables' stride; dims past 2*half pass unrotated
  const int cap = capacity_;
  float* kc = kv.k.get();
  float* vc = kv.v.get();
  const QkNorm qk_norm = spec_.qk_norm;
  // QK-norm, RoPE and the cache append, per token (cheap next to the projections).
  for (int t = 0; t < T; ++t) {
    float* qt = q.row(t).data();
    float* kt = k.row(t).data();
    if (qk_norm == QkNorm::kFull) {  // OLMoE: one RMSNorm over all heads, before the split
      rms_norm(qt, w.q_norm.data(), H_ * hd_, eps_, qt);
      rms_norm(kt, w.k_norm.data(), KV_ * hd_, eps_, kt);
    }
    const float* ct = cos + size_t(t) * half;
    const float* st = sin + size_t(t) * half;
    for (int h = 0; h < H_; ++h) {
      float* qh = qt + size_t(h) * hd_;
      if (qk_norm == QkNorm::kPerHead) rms_norm(qh, w.q_norm.data(), hd_, eps_, qh);
      Rope::apply(qh, ct, st, half);
    }
    const size_t pos = size_t(n_past + t);
    for (int g = 0; g < KV_; ++g) {
      float* kh = kt + size_t(g) * hd_;
      if (qk_norm == QkNorm::kPerHead) rms_norm(kh, w.k_norm.data(), hd_, eps_, kh);
      Rope::apply(kh, ct, st, half);
      const size_t base = (size_t(g) * cap + pos % size_t(cap)) * hd_;
      std::copy(kh, kh + hd_, kc + base);
      const float* vh = v.row(t).data() + size_t(g) * hd_;
      std::copy(vh, vh + hd_, vc + base);
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  const int group = H_ / KV_;
  RowMap attn(attn_rows.data(), T, H_ * hd_);
  const int window = spec_.window;
  const bool sinks = spec_.sinks;
  pool.parallel_for(static_cast<size_t>(H_), [&](size_t hi) {
    const int h = static_cast<int>(hi), g = h / group;
    ConstRowMap K(kc + size_t(g) * cap * hd_, cap, hd_);
    ConstRowMap V(vc + size_t(g) * cap * hd_, cap, hd_);
    auto s_row = s_.scores.row(h);
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
