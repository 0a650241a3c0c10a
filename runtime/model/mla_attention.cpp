// Implementation of runtime/model/mla_attention.h. The projections are whole-matrix products over
// the pool; the absorbed parts run one task per head, each decoding its own rows of wkv_b once per
// call (W_UK and W_UV stay in their stored type: no float copy of wkv_b is kept).
#include "runtime/model/mla_attention.h"

#include <cmath>

#include "common/checked.h"
#include "common/error.h"
#include "common/option_ref.h"
#include "runtime/model/rope.h"

namespace moestream {

float mla_softmax_scale(const ModelConfig& cfg) {
  double scale = 1.0 / std::sqrt(double(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim));
  if (cfg.rope_scaling && cfg.rope_scaling->mscale_all_dim != 0) {
    const double m = yarn_mscale(cfg.rope_scaling->factor, cfg.rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

size_t mla_cache_floats_per_token(const ModelConfig& cfg) {
  return size_t(cfg.kv_lora_rank) + size_t(cfg.qk_rope_head_dim);
}

namespace {
std::string latent_source(int max_context) {
  return "the context length " + std::to_string(max_context) +
         " (" + option_ref("ctx") + ") and model.json's n_layers x (mla.kv_lora_rank + mla.qk_rope_head_dim)";
}
}  // namespace

void MlaScratch::allocate() {
  allocating("the attention scratch", sizeof(float) * uint64_t(cfg.n_heads) * uint64_t(max_context),
             latent_source(max_context), [&] { allocate_now(); });
}

void MlaScratch::allocate_now() {
  const int H = cfg.n_heads, C = cfg.kv_lora_rank, r = cfg.qk_rope_head_dim;
  if (cfg.q_lora_rank > 0) qa.resize(max_batch, cfg.q_lora_rank);
  q.resize(max_batch, H * (cfg.qk_nope_head_dim + r));
  kva.resize(max_batch, C + r);
  q_abs.resize(max_batch, H * (C + r));
  ctx.resize(max_batch, H * C);
  o.resize(max_batch, H * cfg.v_head_dim);
  scores.resize(H, max_context);
  row_buf.resize(H, C);
  in.resize(max_batch, cfg.hidden_size);
  out.resize(max_batch, cfg.hidden_size);
}

void check_latent_cache_size(const ModelConfig& cfg, int max_context) {
  const std::string source = latent_source(max_context);
  const uint64_t per_layer =
      checked_product({uint64_t(max_context), mla_cache_floats_per_token(cfg)}, "the latent KV cache of " + source);
  checked_product({uint64_t(cfg.n_layers), per_layer, sizeof(float)}, "the latent KV cache of " + source);
}

MlaAttention::MlaAttention(const ModelConfig& cfg, MlaScratch& scratch, int max_context, int max_batch)
    : s_(scratch), D_(cfg.hidden_size), H_(cfg.n_heads), Q_(cfg.q_lora_rank), C_(cfg.kv_lora_rank),
      n_(cfg.qk_nope_head_dim), r_(cfg.qk_rope_head_dim), v_(cfg.v_head_dim), max_ctx_(max_context),
      max_batch_(max_batch), eps_(static_cast<float>(cfg.rms_norm_eps)), scale_(mla_softmax_scale(cfg)) {
  if (!cfg.has_mla()) throw ConfigError("model.json: MLA attention needs mla.kv_lora_rank > 0");
  if (r_ <= 0 || r_ % 2 != 0)
    throw ConfigError("model.json: mla.qk_rope_head_dim must be positive and even, got " + std::to_string(r_));
  check_latent_cache_size(cfg, max_context);
}

void MlaAttention::prepare(int state) {
  MOE_ASSERT(state >= 0, "state index");
  if (size_t(state) >= states_.size()) states_.resize(size_t(state) + 1);
  auto& cache = states_[size_t(state)];
  if (cache) return;
  const size_t n = size_t(max_ctx_) * size_t(C_ + r_);
  // Untouched pages cost address space only, as in GqaAttention.
  allocating("the latent KV cache", n * sizeof(float), latent_source(max_ctx_), [&] { cache.reset(new float[n]); });
}

size_t MlaAttention::state_bytes() const {
  size_t n = 0;
  for (const auto& c : states_)
    if (c) n += size_t(max_ctx_) * size_t(C_ + r_) * sizeof(float);
  return n;
}

void MlaAttention::forward(const LayerStep& step, const LayerWeights& w, const float* h, float* out) {
  const int half = r_ / 2;
  for (const StepSequence& sq : step.sequences) {
    MOE_ASSERT(size_t(sq.state) < states_.size() && states_[size_t(sq.state)], "latent state not prepared");
    float* cache = states_[size_t(sq.state)].get();
    const float* cos = step.cos + size_t(sq.row0) * half;
    const float* sin = step.sin + size_t(sq.row0) * half;
    const int r0 = sq.row0, n = sq.n_tokens;
    if (r0 == 0) {  // at the start of the step's rows already, as its run alone has them
      sequence(step.pool, w, cache, h, n, sq.n_past, cos, sin, out);
      continue;
    }
    s_.in.topRows(n) = ConstRowMap(h, step.T, D_).middleRows(r0, n);
    sequence(step.pool, w, cache, s_.in.data(), n, sq.n_past, cos, sin, s_.out.data());
    RowMap(out, step.T, D_).middleRows(r0, n) = s_.out.topRows(n);
  }
}

namespace {
// Row r of m as floats: in place for f32, else decoded into buf.
const float* row_f32(const DenseMatrix& m, size_t r, float* buf) {
  if (m.type == QuantType::kF32) return reinterpret_cast<const float*>(m.data + r * m.row_bytes());
  m.decode_row(r, buf);
  return buf;
}
}  // namespace

void MlaAttention::sequence(ThreadPool& pool, const LayerWeights& w, float* cache, const float* x, int T,
                            int n_past, const float* cos, const float* sin, float* out) {
  MOE_ASSERT(T > 0 && T <= max_batch_ && n_past + T <= max_ctx_);
  MOE_ASSERT(w.wkv_b.rows == size_t(H_) * size_t(n_ + v_) && w.wkv_b.cols == size_t(C_));
  const int qk = n_ + r_, lat = C_ + r_, half = r_ / 2;
  ConstRowMap xm(x, T, D_);
  RowMap q(s_.q.data(), T, H_ * qk), kva(s_.kva.data(), T, lat);
  if (Q_ > 0) {  // q LoRA: down-projection, its RMSNorm, up-projection
    RowMap qa(s_.qa.data(), T, Q_);
    linear(pool, xm, w.wq_a, qa);
    for (int t = 0; t < T; ++t) rms_norm(qa.row(t).data(), w.q_a_norm.data(), Q_, eps_, qa.row(t).data());
    linear(pool, ConstRowMap(s_.qa.data(), T, Q_), w.wq_b, q);
  } else {
    linear(pool, xm, w.wq, q);
  }
  linear(pool, xm, w.wkv_a, kva);

  for (int t = 0; t < T; ++t) {
    const float* ct = cos + size_t(t) * half;
    const float* st = sin + size_t(t) * half;
    float* row = cache + size_t(n_past + t) * lat;
    const float* kt = kva.row(t).data();
    rms_norm(kt, w.kv_a_norm.data(), C_, eps_, row);  // the latent is cached after its norm
    std::copy(kt + C_, kt + lat, row + C_);
    Rope::apply(row + C_, ct, st, half);  // one RoPE key shared by every head
    for (int h = 0; h < H_; ++h) {
      float* qr = q.row(t).data() + size_t(h) * qk + n_;
      Rope::apply(qr, ct, st, half);
      std::copy(qr, qr + r_, s_.q_abs.row(t).data() + size_t(h) * lat + C_);
    }
  }

  ConstRowMap K(cache, max_ctx_, lat);
  RowMap qa_abs(s_.q_abs.data(), T, H_ * lat), ctx(s_.ctx.data(), T, H_ * C_), o(s_.o.data(), T, H_ * v_);
  pool.parallel_for(static_cast<size_t>(H_), [&](size_t hi) {
    const int h = static_cast<int>(hi);
    float* buf = s_.row_buf.row(h).data();
    const size_t base = size_t(h) * size_t(n_ + v_);
    // Absorb W_UK: q_lat = sum_i q_nope[i] * wkv_b[key row i], so q_lat . latent = q_nope . k_nope.
    for (int t = 0; t < T; ++t) qa_abs.row(t).segment(Eigen::Index(h) * lat, C_).setZero();
    for (int i = 0; i < n_; ++i) {
      Eigen::Map<const Eigen::RowVectorXf> wr(row_f32(w.wkv_b, base + size_t(i), buf), C_);
      for (int t = 0; t < T; ++t)
        qa_abs.row(t).segment(Eigen::Index(h) * lat, C_) += q(t, Eigen::Index(h) * qk + i) * wr;
    }
    auto s_row = s_.scores.row(h);
    for (int t = 0; t < T; ++t) {
      const int len = n_past + t + 1;  // causal
      auto s = s_row.head(len);
      s.transpose().noalias() = K.topRows(len) * qa_abs.row(t).segment(Eigen::Index(h) * lat, lat).transpose();
      s *= scale_;
      const float m = s.maxCoeff();
      s = (s.array() - m).exp();
      s /= s.sum();
      ctx.row(t).segment(Eigen::Index(h) * C_, C_).noalias() = s * K.topRows(len).leftCols(C_);
    }
    // W_UV after attention: o = wkv_b[value rows] . ctx, once per token instead of once per position.
    for (int k = 0; k < v_; ++k) {
      Eigen::Map<const Eigen::VectorXf> wr(row_f32(w.wkv_b, base + size_t(n_ + k), buf), C_);
      for (int t = 0; t < T; ++t) o(t, Eigen::Index(h) * v_ + k) = ctx.row(t).segment(Eigen::Index(h) * C_, C_) * wr;
    }
  });
  RowMap om(out, T, D_);
  linear(pool, ConstRowMap(s_.o.data(), T, H_ * v_), w.wo, om);
}

}  // namespace moestream
