// Implementation of runtime/model/cpu_forward.h: embedding, per-layer attention and MoE with
// residuals, final norm and lm_head, for one chunk of at most max_batch tokens.
#include "runtime/model/cpu_forward.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/timing.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "runtime/model/attention.h"
#include "runtime/model/cpu_batch.h"
#include "runtime/model/mla_attention.h"
#include "runtime/model/dense_ops.h"
#include "runtime/model/dense_weights.h"
#include "runtime/model/moe_layer.h"
#include "runtime/model/rope.h"
#include "runtime/model/sampler.h"

namespace moestream {

struct CpuForward::Impl {
  const ModelConfig& cfg;
  ExpertStore& store;
  ThreadPool& pool;
  int max_batch;
  DenseWeights w;
  Rope rope;
  std::unique_ptr<Attention> attention;  // one of the two: standard, or MLA (DeepSeek-V3)
  std::unique_ptr<MlaAttention> mla;
  MoeLayer moe;
  RoutingStep routing_step;  // the chunk's (or a batch step's) override, id check, cache-aware swap, events
  PhaseTimes moe_times;
  RowMatrix x, h, tmp;          // [max_batch, D]
  RowMatrix mlp_act, mlp_up;    // [max_batch, intermediate_size]: dense-MLP layers (GLM-4.5)
  std::vector<float> cos, sin;  // [max_batch, head_dim/2]
  int max_context;
  std::unique_ptr<CpuBatchPass> batch;  // forward_batch's slots and scratch, made on first use
  int moe_lookahead = 0;                // set_moe_lookahead
  bool lookahead_from_override = false;

  Impl(const ModelConfig& c, const std::filesystem::path& dense_path, ExpertStore& store,
       ThreadPool& p, int max_context, int max_batch_)
      : cfg(c), store(store), pool(p), max_batch(max_batch_), w(DenseWeights::load(dense_path, c)), rope(c),
        moe(c, store, max_batch_), routing_step(c), max_context(max_context) {
    if (cfg.has_mla()) mla = std::make_unique<MlaAttention>(cfg, max_context, max_batch);
    else attention = std::make_unique<Attention>(cfg, max_context, max_batch);
    x.resize(max_batch, cfg.hidden_size);
    h.resize(max_batch, cfg.hidden_size);
    tmp.resize(max_batch, cfg.hidden_size);
    cos.resize(size_t(max_batch) * size_t(rope.half_dim()));
    sin.resize(cos.size());
    if (cfg.first_k_dense_replace > 0) {
      mlp_act.resize(max_batch, cfg.intermediate_size);
      mlp_up.resize(max_batch, cfg.intermediate_size);
    }
    // Every pool thread sizes its matvec scratch now, so a decode step allocates nothing even
    // on a thread that first takes a task many steps in (as on a loaded machine).
    // The ggml kernels' scratch (dense matrices in a ggml type, GGUF experts) for up to max_batch
    // inputs of any width a product takes: hidden, the attention output, the expert widths.
    const size_t widest = size_t(std::max({cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_heads * cfg.head_dim,
                                           cfg.shared_expert_intermediate_size, cfg.intermediate_size,
                                           cfg.q_lora_rank, cfg.kv_lora_rank, cfg.n_heads * cfg.v_head_dim}));
    const size_t inputs = size_t(max_batch);
    pool.on_each_thread([widest, inputs] {
      reserve_matvec_scratch(widest);
      ggml_reserve_scratch(widest, inputs);
    });
    // First uses of resident experts are computed while their hashes run on threads the
    // sections leave idle; every pass below checks them all before it returns (issue 19).
    store.set_deferred_checks([&pool = p](std::function<void()> task) { pool.post(std::move(task)); });
  }
  ~Impl() { store.set_deferred_checks({}); }  // the pool may go before the store

  // The dense SwiGLU MLP of a layer below first_k_dense_replace: h -> tmp.
  void dense_mlp(const LayerWeights& lw, int T) {
    const int I = cfg.intermediate_size, D = cfg.hidden_size;
    const ConstRowMap hm(h.data(), T, D);
    RowMap act(mlp_act.data(), T, I), up(mlp_up.data(), T, I);
    const DenseMatrix* ws[2] = {&lw.mlp_gate, &lw.mlp_up};
    RowMap* ys[2] = {&act, &up};
    linear_group(pool, hm, ws, ys);
    swiglu(act, up.data());
    linear(pool, ConstRowMap(act.data(), T, I), lw.mlp_down, RowMap(tmp.data(), T, D));
  }
};

CpuForward::CpuForward(const ModelConfig& cfg, const std::filesystem::path& dense_path,
                       ExpertStore& store, ThreadPool& pool, int max_context, int max_batch)
    : impl_(std::make_unique<Impl>(cfg, dense_path, store, pool, max_context, max_batch)) {}
CpuForward::~CpuForward() = default;

void CpuForward::set_moe_lookahead(int n, bool from_override) {
  if (n < 0 || n > impl_->cfg.n_experts)
    throw ConfigError(option_ref("moe_lookahead") + " " + std::to_string(n) + " is outside [0, n_experts=" +
                      std::to_string(impl_->cfg.n_experts) + "]");
  impl_->moe_lookahead = n;
  impl_->lookahead_from_override = from_override;
}

void CpuForward::forward_batch(const ForwardBatch& batch, const RoutingControl& routing,
                               ForwardTimes& times, CacheAwareStats& cache_aware) {
  Impl& m = *impl_;
  if (!m.batch)
    m.batch = std::make_unique<CpuBatchPass>(m.cfg, m.w, m.rope, m.moe, m.routing_step, m.pool, m.max_context,
                                             m.max_batch);
  m.batch->forward(batch, routing, times, cache_aware);
}

void CpuForward::forward_chunk(const ForwardChunk& c, const RoutingControl& routing,
                               ForwardTimes& times, CacheAwareStats& cache_aware) {
  Impl& m = *impl_;
  const ModelConfig& cfg = m.cfg;
  const int T = c.n_tokens, D = cfg.hidden_size;
  MOE_ASSERT(T > 0 && T <= m.max_batch);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < T; ++t) {
    MOE_ASSERT(c.tokens[t] >= 0 && size_t(c.tokens[t]) < m.w.embed.rows, "token id outside the vocabulary");
    m.w.embed.decode_row(size_t(c.tokens[t]), m.x.row(t).data());
  }
  m.rope.fill(c.n_past, T, m.cos.data(), m.sin.data());
  times.other_s += seconds_since(t0);

  m.routing_step.begin_chunk(routing, c, cache_aware);
  MoeRouting mr;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& lw = m.w.layers[size_t(l)];
    auto ta = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t)
      rms_norm(m.x.row(t).data(), lw.attn_norm.data(), D, eps, m.h.row(t).data());
    if (m.mla) m.mla->forward(m.pool, l, lw, m.h.data(), T, c.n_past, m.cos.data(), m.sin.data(), m.tmp.data());
    else m.attention->forward(m.pool, l, lw, m.h.data(), T, c.n_past, m.cos.data(), m.sin.data(), m.tmp.data());
    m.x.topRows(T) += m.tmp.topRows(T);
    times.attention_s += seconds_since(ta);

    auto tm = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t)
      rms_norm(m.x.row(t).data(), lw.ffn_norm.data(), D, eps, m.h.row(t).data());
    if (!cfg.is_moe_layer(l)) {  // GLM-4.5 / DeepSeek-V3's first layers: no experts, no routing
      m.dense_mlp(lw, T);
      m.x.topRows(T) += m.tmp.topRows(T);
      times.expert_compute_s += seconds_since(tm);
      continue;
    }
    const int moe_l = cfg.moe_layer_index(l);  // experts, logs and overrides number MoE layers
    PhaseTimes before = m.moe_times;
    // Look-ahead: the next decoder layer's router, when that layer has experts.
    const bool ahead = m.moe_lookahead > 0 && l + 1 < cfg.n_layers && cfg.is_moe_layer(l + 1);
    mr.lookahead = ahead ? m.moe_lookahead : 0;
    mr.lookahead_next = ahead ? &m.w.layers[size_t(l) + 1] : nullptr;
    mr.lookahead_layer = ahead ? cfg.moe_layer_index(l + 1) : -1;
    mr.lookahead_from_override = m.lookahead_from_override;
    m.moe.forward(m.pool, moe_l, lw, m.h.data(), T, m.tmp.data(), m.moe_times, m.routing_step, mr);
    if (m.routing_step.observed()) {
      m.moe.verify_pending(m.pool, m.moe_times.expert_io_s);  // the event hands out this layer's input
      m.routing_step.publish(moe_l, m.moe.last_ids().data(), m.moe.last_weights().data(), m.h.data());
    }
    m.x.topRows(T) += m.tmp.topRows(T);
    const double moe_total = seconds_since(tm);
    const double router = m.moe_times.router_s - before.router_s;
    const double io = m.moe_times.expert_io_s - before.expert_io_s;
    times.router_s += router;
    times.expert_io_s += io;
    times.expert_compute_s += moe_total - router - io;  // norm and residual count as compute
  }

  if (c.logits != nullptr) {
    auto tl = std::chrono::steady_clock::now();
    const int first = c.all_logits ? 0 : T - 1;
    const int rows = T - first;
    for (int t = first; t < T; ++t)
      rms_norm(m.x.row(t).data(), m.w.final_norm.data(), D, eps, m.h.row(t - first).data());
    linear(m.pool, ConstRowMap(m.h.data(), rows, D), m.w.output(),
           RowMap(c.logits, rows, cfg.vocab_size));
    times.other_s += seconds_since(tl);
  }
  // After lm_head, whose sections the last layer's hashes overlapped: nothing leaves the pass
  // (logits, KV entries for the next chunk) before every first use it computed passed.
  m.moe.verify_pending(m.pool, times.expert_io_s);
  if (c.argmax != nullptr) {
    MOE_ASSERT(c.logits != nullptr && !c.all_logits, "forward_chunk: argmax needs the last token's logits");
    *c.argmax = Sampler::argmax(std::span<const float>(c.logits, size_t(cfg.vocab_size)));
  }
}

}  // namespace moestream
