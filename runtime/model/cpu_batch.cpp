// Implementation of runtime/model/cpu_batch.h, and ForwardPass::forward_batch's refusal.
#include "runtime/model/cpu_batch.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "common/timing.h"
#include "runtime/model/dense_ops.h"

namespace moestream {

void ForwardPass::forward_batch(const ForwardBatch&, const RoutingControl&, ForwardTimes&,
                                CacheAwareStats&) {
  throw ConfigError("this forward pass runs one sequence at a time: batches of sequences "
                    "(Model::forward_batch) need the CPU pass (not --gpu)");
}

CpuBatchPass::CpuBatchPass(const ModelConfig& cfg, const DenseWeights& w, const Rope& rope,
                           MoeLayer& moe, ThreadPool& pool, int max_context, int max_batch)
    : cfg_(cfg), w_(w), rope_(rope), moe_(moe), pool_(pool), max_context_(max_context),
      max_batch_(max_batch) {
  x_.resize(max_batch, cfg.hidden_size);
  h_.resize(max_batch, cfg.hidden_size);
  tmp_.resize(max_batch, cfg.hidden_size);
  in_.resize(max_batch, cfg.hidden_size);
  out_.resize(max_batch, cfg.hidden_size);
  cos_.resize(size_t(max_batch) * size_t(rope.half_dim()));
  sin_.resize(cos_.size());
  if (cfg.first_k_dense_replace > 0) {
    mlp_act_.resize(max_batch, cfg.intermediate_size);
    mlp_up_.resize(max_batch, cfg.intermediate_size);
  }
  splits_.reserve(size_t(max_batch) + 1);
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

// CpuForward's dense SwiGLU MLP (layers below first_k_dense_replace) over T rows: in_ -> out_.
void CpuBatchPass::dense_mlp(const LayerWeights& lw, int T) {
  const int I = cfg_.intermediate_size, D = cfg_.hidden_size;
  const ConstRowMap hm(in_.data(), T, D);
  RowMap act(mlp_act_.data(), T, I), up(mlp_up_.data(), T, I);
  linear(pool_, hm, lw.mlp_gate, act);
  linear(pool_, hm, lw.mlp_up, up);
  act.array() = act.array() / (1.0f + (-act.array()).exp()) * up.array();
  linear(pool_, ConstRowMap(act.data(), T, I), lw.mlp_down, RowMap(out_.data(), T, D));
}

void CpuBatchPass::forward(const ForwardBatch& b, const RoutingControl& routing, ForwardTimes& times,
                           CacheAwareStats& cache_aware) {
  const int D = cfg_.hidden_size, half = rope_.half_dim(), n = b.n_entries;
  MOE_ASSERT(n > 0 && b.entries != nullptr, "empty batch");
  MOE_ASSERT(!routing.override, "routing overrides run one sequence at a time");
  // Entry i owns rows splits_[i]..splits_[i+1] of every scratch matrix.
  splits_.assign(1, 0);
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
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

  const MoeRouting mr{nullptr, 0, routing.cache_aware, &cache_aware, splits_};
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const LayerWeights& lw = w_.layers[size_t(l)];
    auto ta = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x_.row(t).data(), lw.attn_norm.data(), D, eps, h_.row(t).data());
    for (int i = 0; i < n; ++i) {  // each sequence against its own KV slot
      const ForwardChunk& c = b.entries[i].chunk;
      const int r0 = splits_[size_t(i)];
      in_.topRows(c.n_tokens) = h_.middleRows(r0, c.n_tokens);
      const float* cos = cos_.data() + size_t(r0) * half;
      const float* sin = sin_.data() + size_t(r0) * half;
      Slot& s = slot(b.entries[i].slot);
      if (s.mla)
        s.mla->forward(pool_, l, lw, in_.data(), c.n_tokens, c.n_past, cos, sin, out_.data());
      else
        s.attention->forward(pool_, l, lw, in_.data(), c.n_tokens, c.n_past, cos, sin, out_.data());
      tmp_.middleRows(r0, c.n_tokens) = out_.topRows(c.n_tokens);
    }
    x_.topRows(T) += tmp_.topRows(T);
    times.attention_s += seconds_since(ta);

    auto tm = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x_.row(t).data(), lw.ffn_norm.data(), D, eps, h_.row(t).data());
    if (!cfg_.is_moe_layer(l)) {  // dense-MLP layers (GLM-4.5, DeepSeek-V3): per sequence
      for (int i = 0; i < n; ++i) {
        const int r0 = splits_[size_t(i)], rows = b.entries[i].chunk.n_tokens;
        in_.topRows(rows) = h_.middleRows(r0, rows);
        dense_mlp(lw, rows);
        tmp_.middleRows(r0, rows) = out_.topRows(rows);
      }
      x_.topRows(T) += tmp_.topRows(T);
      times.expert_compute_s += seconds_since(tm);
      continue;
    }
    const int moe_l = cfg_.moe_layer_index(l);
    const PhaseTimes before = moe_times_;
    moe_.forward(pool_, moe_l, lw, h_.data(), T, tmp_.data(), moe_times_, mr);
    if (routing.on_routing) {
      const int K = cfg_.n_experts_per_tok;
      for (int i = 0; i < n; ++i) {  // one event per sequence, tagged with its slot
        const ForwardChunk& c = b.entries[i].chunk;
        const size_t r0 = size_t(splits_[size_t(i)]);
        RoutingEvent ev{moe_l, c.n_past, c.n_tokens, K, D, c.prefill,
                        moe_.last_ids().data() + r0 * K, moe_.last_weights().data() + r0 * K,
                        h_.data() + r0 * D};
        ev.sequence = b.entries[i].slot;
        routing.on_routing(ev);
      }
    }
    x_.topRows(T) += tmp_.topRows(T);
    const double moe_total = seconds_since(tm);
    const double router = moe_times_.router_s - before.router_s;
    const double io = moe_times_.expert_io_s - before.expert_io_s;
    times.router_s += router;
    times.expert_io_s += io;
    times.expert_compute_s += moe_total - router - io;
  }

  auto tl = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {  // lm_head per sequence, over the rows it asked for
    const ForwardChunk& c = b.entries[i].chunk;
    if (c.logits == nullptr) continue;
    const int r0 = splits_[size_t(i)], first = c.all_logits ? 0 : c.n_tokens - 1;
    const int rows = c.n_tokens - first;
    for (int t = 0; t < rows; ++t)
      rms_norm(x_.row(r0 + first + t).data(), w_.final_norm.data(), D, eps, h_.row(t).data());
    linear(pool_, ConstRowMap(h_.data(), rows, D), w_.output(), RowMap(c.logits, rows, cfg_.vocab_size));
  }
  times.other_s += seconds_since(tl);
}

}  // namespace moestream
