// Implementation of runtime/model/cpu_forward.h: embedding, the layer stack, final norm and
// lm_head, for a chunk of one sequence or a step of several (at most max_batch rows either way).
//
// A batch (continuous batching) runs the dense products once over all of the step's rows, each
// sequence's attention against its own state, then every token routed and the union of the
// selected experts fetched once. Each sequence's numbers equal, bitwise, those of its run alone
// with the same chunks, by construction: linear_ranges gives each sequence's rows the product
// its run alone computes (dense_ops.h), a sequence's attention runs on its own rows at the start
// of a scratch, and the MoE layer computes each (expert, token) pair and each token's weighted
// sum on its own.
#include "runtime/model/cpu_forward.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "runtime/model/dense_ops.h"
#include "runtime/model/dense_weights.h"
#include "runtime/model/layer_stack.h"
#include "runtime/model/rope.h"
#include "runtime/model/routing_step.h"
#include "runtime/model/sampler.h"

namespace moestream {

void ForwardPass::forward_batch(const ForwardBatch&, const RoutingControl&, ForwardTimes&, CacheAwareStats&) {
  throw ConfigError("this forward pass runs one sequence at a time: batches of sequences "
                    "(Model::forward_batch) need the CPU pass (not --gpu)");
}

struct CpuForward::Impl {
  const ModelConfig& cfg;
  ExpertStore& store;
  ThreadPool& pool;
  int max_batch, max_context;
  DenseWeights w;
  Rope rope;
  LayerStack stack;
  RoutingStep routing_step;  // the chunk's (or a batch step's) override, id check, cache-aware swap, events
  RowMatrix x, h;               // [max_batch, D]: the residual stream, the final norm's rows
  RowMatrix logits;             // [rows, vocab]: lm_head of a batch step, grown to the most rows asked
  std::vector<float> cos, sin;  // [max_batch, rope half]
  std::vector<int> splits, logit_splits;
  std::vector<StepSequence> sequences;
  std::vector<RoutingSequence> routed;  // the batch's entries as the routing step sees them
  int moe_lookahead = 0;                // set_moe_lookahead
  bool lookahead_from_override = false;

  Impl(const ModelConfig& c, const std::filesystem::path& dense_path, ExpertStore& store, ThreadPool& p,
       int max_context, int max_batch_)
      : cfg(c), store(store), pool(p), max_batch(max_batch_), max_context(max_context),
        w(DenseWeights::load(dense_path, c)), rope(c), stack(c, w, store, max_context, max_batch_), routing_step(c) {
    x.resize(max_batch, cfg.hidden_size);
    h.resize(max_batch, cfg.hidden_size);
    cos.resize(size_t(max_batch) * size_t(rope.half_dim()));
    sin.resize(cos.size());
    splits.reserve(size_t(max_batch) + 1);
    logit_splits.reserve(size_t(max_batch) + 1);
    sequences.reserve(size_t(max_batch));
    routed.reserve(size_t(max_batch));
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

  // Row t of x: token id's embedding.
  void embed(int t, int token) {
    MOE_ASSERT(token >= 0 && size_t(token) < w.embed.rows, "token id outside the vocabulary");
    w.embed.decode_row(size_t(token), x.row(t).data());
  }
  LayerStep step(int T) {
    return LayerStep{pool, T, splits, sequences, cos.data(), sin.data(), &routing_step, nullptr, {}};
  }
};

CpuForward::CpuForward(const ModelConfig& cfg, const std::filesystem::path& dense_path,
                       ExpertStore& store, ThreadPool& pool, int max_context, int max_batch)
    : impl_(std::make_unique<Impl>(cfg, dense_path, store, pool, max_context, max_batch)) {}
CpuForward::~CpuForward() = default;

void CpuForward::set_moe_lookahead(int n, bool from_override) {
  if (n < 0 || n > impl_->cfg.n_experts)
    throw ConfigError("--moe-lookahead " + std::to_string(n) + " is outside [0, n_experts=" +
                      std::to_string(impl_->cfg.n_experts) + "]");
  impl_->moe_lookahead = n;
  impl_->lookahead_from_override = from_override;
}

void CpuForward::forward_chunk(const ForwardChunk& c, const RoutingControl& routing,
                               ForwardTimes& times, CacheAwareStats& cache_aware) {
  Impl& m = *impl_;
  const ModelConfig& cfg = m.cfg;
  const int T = c.n_tokens, D = cfg.hidden_size;
  MOE_ASSERT(T > 0 && T <= m.max_batch);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < T; ++t) m.embed(t, c.tokens[t]);
  m.rope.fill(c.n_past, T, m.cos.data(), m.sin.data());
  m.splits.assign({0, T});
  m.sequences.assign({StepSequence{kOwnSequence, 0, T, c.n_past}});
  times.other_s += seconds_since(t0);

  m.routing_step.begin_chunk(routing, c, cache_aware);
  LayerStep step = m.step(T);
  m.stack.forward(step, m.x.data(), m.moe_lookahead, m.lookahead_from_override, times);

  if (c.logits != nullptr) {
    auto tl = std::chrono::steady_clock::now();
    const int first = c.all_logits ? 0 : T - 1;
    const int rows = T - first;
    for (int t = first; t < T; ++t)
      rms_norm(m.x.row(t).data(), m.w.final_norm.data(), D, eps, m.h.row(t - first).data());
    linear(m.pool, ConstRowMap(m.h.data(), rows, D), m.w.output(), RowMap(c.logits, rows, cfg.vocab_size));
    times.other_s += seconds_since(tl);
  }
  // After lm_head, whose sections the last layer's hashes overlapped: nothing leaves the pass
  // (logits, KV entries for the next chunk) before every first use it computed passed.
  m.stack.verify_pending(m.pool, times.expert_io_s);
  if (c.argmax != nullptr) {
    MOE_ASSERT(c.logits != nullptr && !c.all_logits, "forward_chunk: argmax needs the last token's logits");
    *c.argmax = Sampler::argmax(std::span<const float>(c.logits, size_t(cfg.vocab_size)));
  }
}

void CpuForward::forward_batch(const ForwardBatch& b, const RoutingControl& routing, ForwardTimes& times,
                               CacheAwareStats& cache_aware) {
  Impl& m = *impl_;
  const int D = m.cfg.hidden_size, half = m.rope.half_dim(), n = b.n_entries;
  MOE_ASSERT(n > 0 && b.entries != nullptr, "empty batch");
  MOE_ASSERT(!routing.override, "the model's routing override has one clock: batches take per-sequence ones");
  // Entry i owns rows splits[i]..splits[i+1] of every scratch matrix.
  auto t0 = std::chrono::steady_clock::now();
  m.splits.assign(1, 0);
  m.sequences.clear();
  m.routed.clear();
  for (int i = 0; i < n; ++i) {
    const BatchEntry& e = b.entries[i];
    const ForwardChunk& c = e.chunk;
    MOE_ASSERT(e.slot >= 0 && e.slot < kMaxBatchSlots, "batch slot out of range");
    MOE_ASSERT(c.n_tokens > 0 && c.n_past >= 0 && c.n_past + c.n_tokens <= m.max_context);
    for (int j = 0; j < i; ++j) MOE_ASSERT(b.entries[j].slot != e.slot, "slot twice in a batch");
    const int r0 = m.splits.back();
    MOE_ASSERT(r0 + c.n_tokens <= m.max_batch, "batch larger than max_batch");
    m.routed.push_back(RoutingSequence{r0, c.n_tokens, c.n_past, c.prefill, e.slot, e.override, c.ordinal});
    m.sequences.push_back(StepSequence{batch_state(e.slot), r0, c.n_tokens, c.n_past});
    m.splits.push_back(r0 + c.n_tokens);
    for (int t = 0; t < c.n_tokens; ++t) m.embed(r0 + t, c.tokens[t]);
    m.rope.fill(c.n_past, c.n_tokens, m.cos.data() + size_t(r0) * half, m.sin.data() + size_t(r0) * half);
    m.stack.prepare(batch_state(e.slot));  // allocated before the timed layers
  }
  const int T = m.splits.back();
  const float eps = static_cast<float>(m.cfg.rms_norm_eps);
  times.other_s += seconds_since(t0);

  m.routing_step.begin_chunk(routing, m.routed, cache_aware);
  LayerStep step = m.step(T);
  m.stack.forward(step, m.x.data(), 0, false, times);

  // lm_head once over the rows every sequence asks logits for, then out to each one's buffer.
  auto tl = std::chrono::steady_clock::now();
  m.logit_splits.assign(1, 0);
  for (int i = 0; i < n; ++i) {
    const ForwardChunk& c = b.entries[i].chunk;
    if (c.logits == nullptr) continue;
    const int r0 = m.splits[size_t(i)], first = c.all_logits ? 0 : c.n_tokens - 1;
    for (int t = first; t < c.n_tokens; ++t)
      rms_norm(m.x.row(r0 + t).data(), m.w.final_norm.data(), D, eps, m.h.row(m.logit_splits.back() + t - first).data());
    m.logit_splits.push_back(m.logit_splits.back() + c.n_tokens - first);
  }
  const int rows = m.logit_splits.back(), V = m.cfg.vocab_size;
  if (rows > 0) {
    if (m.logits.rows() < rows) m.logits.resize(rows, V);  // grows to the most rows a step asked
    linear_ranges(m.pool, ConstRowMap(m.h.data(), rows, D), m.w.output(), RowMap(m.logits.data(), rows, V),
                  m.logit_splits);
    for (int i = 0, j = 0; i < n; ++i) {
      const ForwardChunk& c = b.entries[i].chunk;
      if (c.logits == nullptr) continue;
      const int r = m.logit_splits[size_t(j)], k = m.logit_splits[size_t(j) + 1] - r;
      std::copy_n(m.logits.row(r).data(), size_t(k) * size_t(V), c.logits);
      ++j;
    }
  }
  times.other_s += seconds_since(tl);
  m.stack.verify_pending(m.pool, times.expert_io_s);  // every first use checked before the step returns
}

}  // namespace moestream
