// Implementation of runtime/model/cpu_batch.h, and ForwardPass::forward_batch's refusal.
#include "runtime/model/cpu_batch.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/timing.h"
#include "runtime/model/dense_ops.h"

namespace moestream {

void ForwardPass::forward_batch(const ForwardBatch&, const RoutingControl&, ForwardTimes&,
                                CacheAwareStats&) {
  throw ConfigError("this forward pass runs one sequence at a time: batches of sequences "
                    "(Model::forward_batch) need the CPU pass (not " + option_ref("gpu") + ")");
}

CpuBatchPass::CpuBatchPass(const ModelConfig& cfg, const DenseWeights& w, const Rope& rope,
                           MoeLayer& moe, RoutingStep& routing_step, ThreadPool& pool, int max_context,
                           int max_batch)
    : cfg_(cfg), w_(w), rope_(rope), moe_(moe), routing_step_(routing_step), pool_(pool), max_context_(max_context),
      max_batch_(max_batch) {
  x_.resize(max_batch, cfg.hidden_size);
  h_.resize(max_batch, cfg.hidden_size);
  tmp_.resize(max_batch, cfg.hidden_size);
  if (cfg.has_mla()) {
    in_.resize(max_batch, cfg.hidden_size);
    out_.resize(max_batch, cfg.hidden_size);
  }
  cos_.resize(size_t(max_batch) * size_t(rope.half_dim()));
  sin_.resize(cos_.size());
  if (!cfg.has_mla()) {
    q_.resize(max_batch, cfg.n_heads * cfg.head_dim);
    attn_.resize(max_batch, cfg.n_heads * cfg.head_dim);
    k_.resize(max_batch, cfg.n_kv_heads * cfg.head_dim);
    v_.resize(max_batch, cfg.n_kv_heads * cfg.head_dim);
  }
  logit_splits_.reserve(size_t(max_batch) + 1);
  if (cfg.first_k_dense_replace > 0) {
    mlp_act_.resize(max_batch, cfg.intermediate_size);
    mlp_up_.resize(max_batch, cfg.intermediate_size);
    mlp_scratch_.resize(max_batch, cfg.intermediate_size);
  }
  splits_.reserve(size_t(max_batch) + 1);
  sequences_.reserve(size_t(max_batch));
}

CpuBatchPass::~CpuBatchPass() = default;

CpuBatchPass::Slot& CpuBatchPass::slot(int s) {
  MOE_ASSERT(s >= 0 && s < kMaxBatchSlots, "batch slot out of range");
  if (size_t(s) >= slots_.size()) slots_.resize(size_t(s) + 1);
  Slot& a = slots_[size_t(s)];
  if (cfg_.has_mla() && !a.mla) a.mla = std::make_unique<MlaAttention>(cfg_, max_context_, max_batch_);
  if (!cfg_.has_mla() && !a.attention) a.attention = std::make_unique<Attention>(cfg_, max_context_, max_batch_);
  return a;
}

// CpuForward's dense SwiGLU MLP (layers below first_k_dense_replace) over the step's T rows: h_ -> tmp_.
void CpuBatchPass::dense_mlp(const LayerWeights& lw, int T) {
  const int I = cfg_.intermediate_size, D = cfg_.hidden_size;
  const ConstRowMap hm(h_.data(), T, D);
  RowMap act(mlp_act_.data(), T, I), up(mlp_up_.data(), T, I);
  linear_ranges(pool_, hm, lw.mlp_gate, act, splits_);
  linear_ranges(pool_, hm, lw.mlp_up, up, splits_);
  swiglu_ranges(act, up.data(), splits_, mlp_scratch_);
  linear_ranges(pool_, ConstRowMap(act.data(), T, I), lw.mlp_down, RowMap(tmp_.data(), T, D), splits_);
}

// Standard attention of the step: the projections once over all T rows (h_), each sequence's
// attention against its own slot, the output projection once: -> tmp_.
void CpuBatchPass::attention(const ForwardBatch& b, const LayerWeights& lw, int l, int T) {
  const int D = cfg_.hidden_size, half = rope_.half_dim();
  const int Q = cfg_.n_heads * cfg_.head_dim, KV = cfg_.n_kv_heads * cfg_.head_dim;
  const ConstRowMap hm(h_.data(), T, D);
  RowMap q(q_.data(), T, Q), k(k_.data(), T, KV), v(v_.data(), T, KV), a(attn_.data(), T, Q);
  linear_ranges(pool_, hm, lw.wq, q, splits_);
  linear_ranges(pool_, hm, lw.wk, k, splits_);
  linear_ranges(pool_, hm, lw.wv, v, splits_);
  if (lw.bq.size() > 0) {  // Qwen2-MoE's projection biases, as Attention::forward adds them
    q.rowwise() += lw.bq.transpose();
    k.rowwise() += lw.bk.transpose();
    v.rowwise() += lw.bv.transpose();
  }
  for (int i = 0; i < b.n_entries; ++i) {  // each sequence against its own KV slot, in its own scratch
    const ForwardChunk& c = b.entries[i].chunk;
    const int r0 = splits_[size_t(i)], n = c.n_tokens;
    Attention& at = *slot(b.entries[i].slot).attention;
    RowMap(at.q_rows(), n, Q) = q.middleRows(r0, n);
    RowMap(at.k_rows(), n, KV) = k.middleRows(r0, n);
    RowMap(at.v_rows(), n, KV) = v.middleRows(r0, n);
    at.attend(pool_, l, lw, n, c.n_past, cos_.data() + size_t(r0) * half, sin_.data() + size_t(r0) * half);
    a.middleRows(r0, n) = ConstRowMap(at.attn_rows(), n, Q);
  }
  RowMap om(tmp_.data(), T, D);
  linear_ranges(pool_, ConstRowMap(attn_.data(), T, Q), lw.wo, om, splits_);
  if (lw.bo.size() > 0) om.rowwise() += lw.bo.transpose();
}

// MLA (DeepSeek-V2/V3) keeps its products per sequence, each at an aligned start as its run
// alone has them: h_ -> tmp_.
void CpuBatchPass::mla_attention(const ForwardBatch& b, const LayerWeights& lw, int l) {
  const int half = rope_.half_dim();
  for (int i = 0; i < b.n_entries; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    const int r0 = splits_[size_t(i)];
    in_.topRows(c.n_tokens) = h_.middleRows(r0, c.n_tokens);
    slot(b.entries[i].slot).mla->forward(pool_, l, lw, in_.data(), c.n_tokens, c.n_past,
                                         cos_.data() + size_t(r0) * half, sin_.data() + size_t(r0) * half,
                                         out_.data());
    tmp_.middleRows(r0, c.n_tokens) = out_.topRows(c.n_tokens);
  }
}

void CpuBatchPass::forward(const ForwardBatch& b, const RoutingControl& routing, ForwardTimes& times,
                           CacheAwareStats& cache_aware) {
  const int D = cfg_.hidden_size, half = rope_.half_dim(), n = b.n_entries;
  MOE_ASSERT(n > 0 && b.entries != nullptr, "empty batch");
  MOE_ASSERT(!routing.override, "the model's routing override has one clock: batches take per-sequence ones");
  // Entry i owns rows splits_[i]..splits_[i+1] of every scratch matrix.
  splits_.assign(1, 0);
  sequences_.clear();
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    sequences_.push_back(RoutingSequence{splits_.back(), c.n_tokens, c.n_past, c.prefill, b.entries[i].slot,
                                         b.entries[i].override, c.ordinal});
    MOE_ASSERT(c.n_tokens > 0 && c.n_past >= 0 && c.n_past + c.n_tokens <= max_context_);
    for (int j = 0; j < i; ++j) MOE_ASSERT(b.entries[j].slot != b.entries[i].slot, "slot twice in a batch");
    splits_.push_back(splits_.back() + c.n_tokens);
    MOE_ASSERT(splits_.back() <= max_batch_, "batch larger than max_batch");
  }
  const int T = splits_.back();
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    const int r0 = splits_[size_t(i)];
    for (int t = 0; t < c.n_tokens; ++t) {
      MOE_ASSERT(c.tokens[t] >= 0 && size_t(c.tokens[t]) < w_.embed.rows, "token id outside the vocabulary");
      w_.embed.decode_row(size_t(c.tokens[t]), x_.row(r0 + t).data());
    }
    rope_.fill(c.n_past, c.n_tokens, cos_.data() + size_t(r0) * half, sin_.data() + size_t(r0) * half);
    slot(b.entries[i].slot);  // allocated before the timed layers
  }
  times.other_s += seconds_since(t0);

  routing_step_.begin_chunk(routing, sequences_, cache_aware);
  MoeRouting mr;
  mr.row_splits = splits_;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    auto ta = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x_.row(t).data(), lw.attn_norm.data(), D, eps, h_.row(t).data());
    if (cfg_.has_mla()) mla_attention(b, lw, l);
    else attention(b, lw, l, T);
    x_.topRows(T) += tmp_.topRows(T);
    times.attention_s += seconds_since(ta);

    auto tm = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x_.row(t).data(), lw.ffn_norm.data(), D, eps, h_.row(t).data());
    if (!cfg_.is_moe_layer(l)) {  // dense-MLP layers (GLM-4.5, DeepSeek-V3)
      dense_mlp(lw, T);
      x_.topRows(T) += tmp_.topRows(T);
      times.expert_compute_s += seconds_since(tm);
      continue;
    }
    const int moe_l = cfg_.moe_layer_index(l);
    const PhaseTimes before = moe_times_;
    moe_.forward(pool_, moe_l, lw, h_.data(), T, tmp_.data(), moe_times_, routing_step_, mr);
    if (routing_step_.observed()) {  // one event per sequence, tagged with its slot
      moe_.verify_pending(pool_, moe_times_.expert_io_s);  // the events hand out this layer's input
      routing_step_.publish(moe_l, moe_.last_ids().data(), moe_.last_weights().data(), h_.data());
    }
    x_.topRows(T) += tmp_.topRows(T);
    const double moe_total = seconds_since(tm);
    const double router = moe_times_.router_s - before.router_s;
    const double io = moe_times_.expert_io_s - before.expert_io_s;
    times.router_s += router;
    times.expert_io_s += io;
    times.expert_compute_s += moe_total - router - io;
  }

  // lm_head once over the rows every sequence asks logits for, then out to each one's buffer.
  auto tl = std::chrono::steady_clock::now();
  logit_splits_.assign(1, 0);
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    if (c.logits == nullptr) continue;
    const int r0 = splits_[size_t(i)], first = c.all_logits ? 0 : c.n_tokens - 1;
    for (int t = first; t < c.n_tokens; ++t)
      rms_norm(x_.row(r0 + t).data(), w_.final_norm.data(), D, eps, h_.row(logit_splits_.back() + t - first).data());
    logit_splits_.push_back(logit_splits_.back() + c.n_tokens - first);
  }
  const int rows = logit_splits_.back(), V = cfg_.vocab_size;
  if (rows > 0) {
    if (logits_.rows() < rows) logits_.resize(rows, V);  // grows to the most rows a step asked
    linear_ranges(pool_, ConstRowMap(h_.data(), rows, D), w_.output(), RowMap(logits_.data(), rows, V),
                  logit_splits_);
    for (int i = 0, j = 0; i < n; ++i) {
      const ForwardChunk& c = b.entries[i].chunk;
      if (c.logits == nullptr) continue;
      const int r = logit_splits_[size_t(j)], m = logit_splits_[size_t(j) + 1] - r;
      std::copy_n(logits_.row(r).data(), size_t(m) * size_t(V), c.logits);
      ++j;
    }
  }
  times.other_s += seconds_since(tl);
  moe_.verify_pending(pool_, times.expert_io_s);  // every first use checked before the step returns
}

}  // namespace moestream
