// Implementation of runtime/engine/model.h: the decoder loop (embedding, per-layer attention and MoE with
// residuals, final norm, lm_head) over token chunks of at most max_batch.
#include "runtime/engine/model.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "loader/store/store_options.h"
#include "runtime/model/attention.h"
#include "runtime/model/dense_ops.h"
#include "runtime/model/dense_weights.h"
#include "runtime/model/moe_layer.h"
#include "runtime/model/rope.h"
#include "common/thread_pool.h"
#ifdef MOESTREAM_HAS_CUDA
#include "kernels/cuda/gpu_ops.h"
#endif

namespace moestream {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

struct Model::Impl {
  ModelConfig cfg;
  ModelOptions opts;
  DenseWeights w;
  std::unique_ptr<ExpertStore> store;
  ThreadPool pool;
  Rope rope;
  Attention attention;
  MoeLayer moe;
  int n_past = 0;
  bool prefill = false;  // the current forward call started from an empty cache
  RoutingCallback on_routing;
  RoutingOverrideFn routing_override;  // empty = the router decides
  uint64_t tokens_routed = 0;          // tokens through the layers since load: the override's clock
  ForwardTimes times;
  PhaseTimes moe_times;
  RowMatrix x, h, tmp;                  // [max_batch, D]
  std::vector<float> cos, sin;          // [max_batch, head_dim/2]
#ifdef MOESTREAM_HAS_CUDA
  std::unique_ptr<GpuForward> gpu;      // set when opts.gpu: forward() runs there instead
#endif

  // dw is empty on the GPU path, which reads dense_path itself.
  Impl(ModelConfig c, const ModelOptions& o, DenseWeights dw, std::unique_ptr<ExpertStore> s,
       [[maybe_unused]] const std::filesystem::path& dense_path)
      : cfg(std::move(c)), opts(o), w(std::move(dw)), store(std::move(s)), pool(o.n_threads),
        rope(cfg), attention(cfg, o.max_context, o.max_batch), moe(cfg, *store, o.max_batch) {
    x.resize(o.max_batch, cfg.hidden_size);
    h.resize(o.max_batch, cfg.hidden_size);
    tmp.resize(o.max_batch, cfg.hidden_size);
    cos.resize(size_t(o.max_batch) * size_t(rope.half_dim()));
    sin.resize(cos.size());
    moe.set_cache_aware(o.cache_aware);
    if (o.gpu) {
#ifdef MOESTREAM_HAS_CUDA
      GpuForwardOptions go;
      go.max_context = o.max_context;
      go.max_batch = o.max_batch;
      go.cache_mb = o.gpu_cache_mb;
      go.moe_lookahead = o.moe_lookahead;
      // Streamed from the file to the GPU: no float32 copy on the host (5.9 GB for a
      // Qwen3-30B-A3B), so the host memory goes to the expert caches.
      gpu = std::make_unique<GpuForward>(cfg, dense_path, *store, go);
#else
      throw ConfigError("--gpu: " + gpu_unavailable_reason());
#endif
    }
  }

  void forward_chunk(const int* tokens, int T, float* logits, bool all_logits);
};

std::string gpu_unavailable_reason() {
#ifdef MOESTREAM_HAS_CUDA
  const char* why = "";
  if (gpu::device_count(&why) > 0) return "";
  return std::string("no usable CUDA device (") + why + ")";
#else
  return "this build has no CUDA tier (configure with nvcc present and -DMOESTREAM_CUDA=ON)";
#endif
}

void check_gpu_options(const ModelOptions& o, const GpuOptionNames& n) {
  if (o.moe_lookahead < 0)
    throw ConfigError(n.moe_lookahead + " must be >= 0, got " + std::to_string(o.moe_lookahead));
  if (o.moe_lookahead > 0 && !o.gpu)
    throw ConfigError(n.moe_lookahead + n.assign + std::to_string(o.moe_lookahead) +
                      " prefetches into the GPU expert cache: it needs " + n.gpu);
  if (o.gpu_cache_mb > 0 && !o.gpu) throw ConfigError(n.gpu_cache_mb + " needs " + n.gpu);
  if (o.gpu) {
    const std::string why = gpu_unavailable_reason();
    if (!why.empty()) throw ConfigError(n.gpu + ": " + why);
  }
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts) {
  // infer's default store (--io auto and its defaults), through the same builder.
  ModelConfig cfg = ModelConfig::load(dir);
  StoreConfig sc;
  sc.verify_checksums = opts.verify_checksums;
  return load(dir, opts, open_store_for(dir, cfg, sc));
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts_in,
                                   std::unique_ptr<ExpertStore> store) {
  ModelConfig cfg = ModelConfig::load(dir);
  ModelOptions opts = opts_in;
  if (opts.max_context <= 0) opts.max_context = std::min(cfg.max_position_embeddings, 4096);
  if (opts.max_context <= 0) opts.max_context = 4096;
  if (opts.max_batch <= 0)
    throw ConfigError("max_batch must be positive, got " + std::to_string(opts.max_batch));
  opts.max_batch = std::min(opts.max_batch, opts.max_context);
  check_gpu_options(opts);
  if (opts.gpu && opts.cache_aware.enabled)
    throw ConfigError("--cache-aware is not supported with --gpu (the GPU path routes exactly)");
  MOE_ASSERT(store != nullptr);
  const std::filesystem::path dense_path = dir / cfg.dense_file;
  DenseWeights w = opts.gpu ? DenseWeights{} : DenseWeights::load(dense_path, cfg);
  return std::unique_ptr<Model>(new Model(
      std::make_unique<Impl>(std::move(cfg), opts, std::move(w), std::move(store), dense_path)));
}

const ModelConfig& Model::config() const { return impl_->cfg; }
int Model::n_threads() const { return impl_->pool.size(); }
int Model::max_context() const { return impl_->opts.max_context; }
int Model::n_past() const { return impl_->n_past; }
void Model::reset() { impl_->n_past = 0; }
void Model::truncate(int n_tokens) {
  if (n_tokens < 0 || n_tokens > impl_->n_past)
    throw ConfigError("Model::truncate: " + std::to_string(n_tokens) + " is outside [0, n_past=" +
                      std::to_string(impl_->n_past) + "]");
  impl_->n_past = n_tokens;  // later forward() calls overwrite the KV rows past n_tokens
}
void Model::set_routing_callback(RoutingCallback cb) { impl_->on_routing = std::move(cb); }
void Model::set_routing_override(RoutingOverrideFn fn) {
  impl_->routing_override = std::move(fn);
  impl_->moe.set_routing_override(impl_->routing_override ? &impl_->routing_override : nullptr,
                                  impl_->tokens_routed);
}
bool Model::routing_overridden() const { return bool(impl_->routing_override); }
const ForwardTimes& Model::times() const { return impl_->times; }
void Model::reset_times() {
  impl_->times = {};
  impl_->moe_times = {};
}
void Model::set_cache_aware(const CacheAwareOptions& o) {
  if (impl_->opts.gpu && o.enabled)
    throw ConfigError("cache-aware routing is not supported with --gpu (the GPU path routes exactly)");
  impl_->moe.set_cache_aware(o);
}
const CacheAwareOptions& Model::cache_aware() const { return impl_->moe.cache_aware(); }
const CacheAwareStats& Model::cache_aware_stats() const { return impl_->moe.cache_aware_stats(); }
void Model::reset_cache_aware_stats() { impl_->moe.reset_cache_aware_stats(); }
#ifdef MOESTREAM_HAS_CUDA
const GpuForwardInfo* Model::gpu_info() const { return impl_->gpu ? &impl_->gpu->info() : nullptr; }
GpuForwardStats Model::gpu_stats() const { return impl_->gpu ? impl_->gpu->stats() : GpuForwardStats{}; }
void Model::reset_gpu_stats() {
  if (impl_->gpu) impl_->gpu->reset_stats();
}
#else  // no GPU backend can exist in this build (Model::load refuses opts.gpu)
const GpuForwardInfo* Model::gpu_info() const { return nullptr; }
GpuForwardStats Model::gpu_stats() const { return {}; }
void Model::reset_gpu_stats() {}
#endif
ExpertStoreStats Model::expert_stats() const { return impl_->store->stats(); }
const ExpertStore& Model::expert_store() const { return *impl_->store; }

size_t Model::active_bytes_per_token() const {
  const auto& c = impl_->cfg;
  const size_t dense = active_dense_bytes(c);
  const size_t expert = ExpertLayout::make(c.expert_quant, size_t(c.hidden_size),
                                           size_t(c.moe_intermediate_size)).bytes;
  return dense + size_t(c.n_layers) * size_t(c.n_experts_per_tok) * expert;
}

void Model::forward(std::span<const int> tokens, std::span<float> logits, bool all_logits) {
  Impl& m = *impl_;
  const size_t V = size_t(m.cfg.vocab_size);
  if (tokens.empty()) throw ConfigError("forward: empty token list");
  if (logits.size() < (all_logits ? tokens.size() * V : V))
    throw ConfigError("forward: logits buffer too small");
  for (int id : tokens)
    if (id < 0 || id >= m.cfg.vocab_size)
      throw ConfigError("token id " + std::to_string(id) + " outside the vocabulary [0, " +
                        std::to_string(m.cfg.vocab_size) + ")");
  if (size_t(m.n_past) + tokens.size() > size_t(m.opts.max_context))
    throw ConfigError("context full: " + std::to_string(m.n_past) + " + " +
                      std::to_string(tokens.size()) + " tokens exceed the context of " +
                      std::to_string(m.opts.max_context) + " (raise --ctx)");
  m.prefill = m.n_past == 0;
  for (size_t i = 0; i < tokens.size(); i += size_t(m.opts.max_batch)) {
    const int T = int(std::min(tokens.size() - i, size_t(m.opts.max_batch)));
    const bool last = i + size_t(T) == tokens.size();
    float* out = all_logits ? logits.data() + i * V : last ? logits.data() : nullptr;
#ifdef MOESTREAM_HAS_CUDA
    if (m.gpu) {
      m.gpu->forward_chunk(tokens.data() + i, T, m.n_past, out, all_logits, m.prefill,
                           m.on_routing, m.times, &m.routing_override, m.tokens_routed);
      m.tokens_routed += uint64_t(T);
      m.n_past += T;
      continue;
    }
#endif
    m.forward_chunk(tokens.data() + i, T, out, all_logits);
  }
}

void Model::Impl::forward_chunk(const int* tokens, int T, float* logits, bool all_logits) {
  const int D = cfg.hidden_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < T; ++t) x.row(t) = w.embed.row(tokens[t]);
  rope.fill(n_past, T, cos.data(), sin.data());
  times.other_s += seconds_since(t0);

  if (routing_override) moe.set_routing_override(&routing_override, tokens_routed);
  tokens_routed += uint64_t(T);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    auto ta = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x.row(t).data(), lw.attn_norm.data(), D, eps, h.row(t).data());
    attention.forward(pool, l, lw, h.data(), T, n_past, cos.data(), sin.data(), tmp.data());
    x.topRows(T) += tmp.topRows(T);
    times.attention_s += seconds_since(ta);

    auto tm = std::chrono::steady_clock::now();
    for (int t = 0; t < T; ++t) rms_norm(x.row(t).data(), lw.ffn_norm.data(), D, eps, h.row(t).data());
    PhaseTimes before = moe_times;
    moe.forward(pool, l, lw, h.data(), T, tmp.data(), moe_times);
    if (on_routing) {
      RoutingEvent ev{l, n_past, T, cfg.n_experts_per_tok, D, prefill,
                      moe.last_ids().data(), moe.last_weights().data(), h.data()};
      on_routing(ev);
    }
    x.topRows(T) += tmp.topRows(T);
    const double moe_total = seconds_since(tm);
    const double router = moe_times.router_s - before.router_s;
    const double io = moe_times.expert_io_s - before.expert_io_s;
    times.router_s += router;
    times.expert_io_s += io;
    times.expert_compute_s += moe_total - router - io;  // norm and residual count as compute
  }
  n_past += T;

  if (logits == nullptr) return;
  auto tl = std::chrono::steady_clock::now();
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  for (int t = first; t < T; ++t)
    rms_norm(x.row(t).data(), w.final_norm.data(), D, eps, h.row(t - first).data());
  linear(pool, ConstRowMap(h.data(), rows, D), w.output(), RowMap(logits, rows, cfg.vocab_size));
  times.other_s += seconds_since(tl);
}

}  // namespace moestream
