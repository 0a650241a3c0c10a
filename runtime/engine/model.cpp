// Implementation of runtime/engine/model.h: options, KV bookkeeping and the routing controls
// around one ForwardPass, picked at load (CPU, or GPU with ModelOptions::gpu), over chunks of at
// most max_batch tokens.
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "common/mapping_guard.h"
#include "common/option_ref.h"
#include "common/thread_pool.h"
#include "loader/format/dense_checksum.h"
#include "loader/store/store_options.h"
#include "runtime/engine/sequence_slots.h"
#include "runtime/gpu/gpu_forward.h"
#include "runtime/model/cpu_forward.h"
#include "runtime/model/dense_weights.h"

namespace moestream {

struct Model::Impl {
  ModelConfig cfg;
  ModelOptions opts;
  std::unique_ptr<ExpertStore> store;
  ThreadPool pool;                    // the CPU pass's; idle with the GPU's
  std::unique_ptr<ForwardPass> pass;
  GpuForward* gpu = nullptr;          // pass, when it is the GPU's: its counters and description
  int n_past = 0;
  RoutingControl routing;
  uint64_t tokens_routed = 0;         // tokens through the layers since load: the override's clock
  ForwardTimes times;
  CacheAwareStats cache_aware_stats;
  size_t dense_bytes_per_token = 0;   // active_dense_bytes of the pass in use, counted once
  SequenceSlots slots;                // forward_batch's sequences
  SlidingKvHorizon horizon;           // how far forward()'s sequence may rewind (sliding rings)
  std::vector<BatchEntry> batch_entries;
  std::vector<RoutingOverrideFn> sequence_routing;  // by sequence (set_sequence_routing)
  RoutingOverrideFn solo_routing;                   // forward()'s sequence (-1)
  std::vector<float> argmax_logits;                 // forward_argmax's logits scratch
  uint64_t mapping_owner = 0;                       // this model's file mappings (mapping_guard.h)

  void forward(std::span<const int> tokens, std::span<float> logits, bool all_logits, int* argmax);

  Impl(ModelConfig c, const ModelOptions& o, std::unique_ptr<ExpertStore> s,
       const std::filesystem::path& dense_path, uint64_t owner)
      : cfg(std::move(c)), opts(o), store(std::move(s)), pool(o.n_threads),
        slots(o.max_sequences, o.max_context, o.max_batch, cfg.vocab_size), mapping_owner(owner) {
    routing.cache_aware = o.cache_aware;
    // The store hashes an expert's first use from its resident pages on these threads (between
    // the pass's parallel sections: the store is called from this thread only).
    store->set_parallel_for([this](size_t n, const std::function<void(size_t)>& fn) { pool.parallel_for(n, fn); });
    horizon = SlidingKvHorizon(cfg, o.max_context, o.max_batch);  // both passes keep these rings
    slots.set_horizon(horizon);
    if (o.gpu) {
      GpuForwardOptions go;
      go.max_context = o.max_context;
      go.max_batch = o.max_batch;
      go.cache_mb = o.gpu_cache_mb;
      go.moe_lookahead = o.moe_lookahead;
      go.resident_decode = !o.gpu_sync_layers;
      go.graphs = !o.gpu_no_graphs;
      go.pin_page_cache = o.gpu_pin_page_cache;
      go.preload = o.gpu_preload;
      go.on_preload = o.on_gpu_preload;
      go.cpu_misses = o.gpu_cpu_misses;
      go.cpu_pool = &pool;
      // Copied from the mapped file to the GPU in their stored types: no float32 copy on the
      // host or the device, so the memory goes to the expert caches.
      std::unique_ptr<GpuForward> g = GpuForward::create(cfg, dense_path, *store, go);
      gpu = g.get();
      pass = std::move(g);
    } else {
      auto cpu = std::make_unique<CpuForward>(cfg, dense_path, *store, pool, o.max_context, o.max_batch);
      cpu->set_moe_lookahead(o.moe_lookahead, o.moe_lookahead_replayed);  // the store reads them ahead
      pass = std::move(cpu);
    }
    dense_bytes_per_token = active_dense_bytes(cfg, dense_path);  // after the pass checked the file
    check_mapped_files(mapping_owner);  // the load read (or uploaded) every dense weight from them
  }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

StoreConfig store_config_for(const ModelOptions& opts, StoreConfig c) {
  c.verify_checksums = opts.verify_checksums;
  c.auto_direct = c.auto_direct && !opts.gpu_pin_page_cache;
  return c;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts) {
  // infer's default store (--io auto and its defaults), through the same builder.
  ModelConfig cfg = ModelConfig::load(dir);
  const MappingOwnerScope owner(new_mapping_owner());  // the store's mappings are this model's
  return load(dir, opts, open_store_for(dir, cfg, store_config_for(opts, StoreConfig{})));
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, const ModelOptions& opts_in,
                                   std::unique_ptr<ExpertStore> store) {
  ModelConfig cfg = ModelConfig::load(dir);
  ModelOptions opts = opts_in;
  // Front ends check these first in their own spelling (--ctx, ctx=); this catches other callers.
  check_range("ModelOptions.n_threads", opts.n_threads, 0, kMaxThreads);
  check_range("ModelOptions.max_context", opts.max_context, 0, kMaxContext);
  // Any finite tolerance works here (tests use 1e6 for "substitute anything"); front ends cap it.
  check_range("ModelOptions.cache_aware.tolerance", opts.cache_aware.tolerance, 0.0f,
              std::numeric_limits<float>::max());
  check_range("ModelOptions.gpu_cache_mb", uint64_t(opts.gpu_cache_mb), uint64_t(0), kMaxGpuCacheMb);
  if (opts.max_context <= 0) opts.max_context = std::min(cfg.max_position_embeddings, 4096);
  if (opts.max_context <= 0) opts.max_context = 4096;
  check_range("ModelOptions.max_batch", opts.max_batch, 1, 1 << 20);
  opts.max_batch = std::min(opts.max_batch, opts.max_context);
  check_range("ModelOptions.max_sequences", opts.max_sequences, 1, kMaxBatchSlots);
  check_model_options(opts);  // options.h: front ends check first, in their spelling
  MOE_ASSERT(store != nullptr);
  // A pack's dense weights against model.json's checksum, before anything maps them (a GGUF
  // records none; its files are watched for changes as every mapped file is).
  if (opts.verify_checksums) verify_dense_checksum(dir, cfg);
  // A GGUF is its own dense file.
  const std::filesystem::path dense_path = cfg.format == ModelFormat::kGguf ? dir : dir / cfg.dense_file;
  // The caller's scope when it opened the store in one (infer, the server, Python), else a new one.
  const uint64_t owner = current_mapping_owner() != 0 ? current_mapping_owner() : new_mapping_owner();
  const MappingOwnerScope scope(owner);
  return std::unique_ptr<Model>(
      new Model(std::make_unique<Impl>(std::move(cfg), opts, std::move(store), dense_path, owner)));
}

const ModelConfig& Model::config() const { return impl_->cfg; }
int Model::n_threads() const { return impl_->pool.size(); }
int Model::max_context() const { return impl_->opts.max_context; }
int Model::n_past() const { return impl_->n_past; }
void Model::reset() {
  impl_->n_past = 0;
  impl_->horizon.truncated(0);
}
void Model::truncate(int n_tokens) {
  if (n_tokens < 0 || n_tokens > impl_->n_past)
    throw ConfigError("Model::truncate: " + std::to_string(n_tokens) + " is outside [0, n_past=" +
                      std::to_string(impl_->n_past) + "]");
  // A sliding ring that lost the window before n_tokens keeps nothing (n_past() says).
  n_tokens = impl_->horizon.keepable(n_tokens);
  impl_->horizon.truncated(n_tokens);
  impl_->n_past = n_tokens;  // later forward() calls overwrite the KV rows past n_tokens
}
void Model::set_routing_callback(RoutingCallback cb) { impl_->routing.on_routing = std::move(cb); }
void Model::set_routing_override(RoutingOverrideFn fn) {
  if (fn && impl_->solo_routing)
    throw ConfigError("set_routing_override: forward()'s sequence replays its own routing "
                      "(set_sequence_routing(-1)); clear that first");
  impl_->routing.override = std::move(fn);
}
void Model::set_sequence_routing(int sequence, RoutingOverrideFn fn) {
  Impl& m = *impl_;
  if (sequence == -1) {
    if (fn && m.routing.override)
      throw ConfigError("set_sequence_routing(-1): the model-wide routing override (set_routing_override) "
                        "is set; clear it first");
    m.solo_routing = std::move(fn);
    return;
  }
  (void)m.slots.n_past(sequence);  // ConfigError naming the sequence when it is not live
  if (m.sequence_routing.size() <= size_t(sequence)) m.sequence_routing.resize(size_t(sequence) + 1);
  m.sequence_routing[size_t(sequence)] = std::move(fn);
}
bool Model::routing_overridden() const { return bool(impl_->routing.override); }
const ForwardTimes& Model::times() const { return impl_->times; }
void Model::reset_times() { impl_->times = {}; }
void Model::set_cache_aware(const CacheAwareOptions& o) { impl_->routing.cache_aware = o; }
const CacheAwareOptions& Model::cache_aware() const { return impl_->routing.cache_aware; }
const CacheAwareStats& Model::cache_aware_stats() const { return impl_->cache_aware_stats; }
void Model::reset_cache_aware_stats() { impl_->cache_aware_stats = {}; }
const GpuForwardInfo* Model::gpu_info() const { return impl_->gpu ? &impl_->gpu->info() : nullptr; }
GpuForwardStats Model::gpu_stats() const { return impl_->gpu ? impl_->gpu->stats() : GpuForwardStats{}; }
void Model::reset_gpu_stats() {
  if (impl_->gpu) impl_->gpu->reset_stats();
}
ExpertStoreStats Model::expert_stats() const { return impl_->store->stats(); }
const ExpertStore& Model::expert_store() const { return *impl_->store; }

size_t Model::active_bytes_per_token() const {
  const auto& c = impl_->cfg;
  const size_t dense = impl_->dense_bytes_per_token;
  size_t experts = 0;
  for (int l = 0; l < c.n_moe_layers(); ++l) experts += size_t(c.n_experts_per_tok) * c.expert_layout(l).bytes;
  return dense + experts;
}

void Model::forward(std::span<const int> tokens, std::span<float> logits, bool all_logits) {
  impl_->forward(tokens, logits, all_logits, nullptr);
}

int Model::forward_argmax(std::span<const int> tokens) {
  Impl& m = *impl_;
  m.argmax_logits.resize(size_t(m.cfg.vocab_size));  // the passes' scratch, allocated once
  int id = -1;
  m.forward(tokens, m.argmax_logits, false, &id);
  MOE_ASSERT(id >= 0 && id < m.cfg.vocab_size, "forward_argmax: the pass picked no token");
  return id;
}

void Model::Impl::forward(std::span<const int> tokens, std::span<float> logits, bool all_logits, int* argmax) {
  Impl& m = *this;
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
                      std::to_string(m.opts.max_context) + " (raise " + option_ref("ctx") + ")");
  const bool prefill = m.n_past == 0;
  // A replay of this sequence's own (set_sequence_routing(-1)): its clock is the position.
  std::optional<RoutingControl> solo;
  if (m.solo_routing) {
    solo.emplace(m.routing);
    solo->override = m.solo_routing;
  }
  for (size_t i = 0; i < tokens.size(); i += size_t(m.opts.max_batch)) {
    const int T = int(std::min(tokens.size() - i, size_t(m.opts.max_batch)));
    const bool last = i + size_t(T) == tokens.size();
    ForwardChunk c;
    c.tokens = tokens.data() + i;
    c.n_tokens = T;
    c.n_past = m.n_past;
    c.logits = all_logits ? logits.data() + i * V : last ? logits.data() : nullptr;
    c.all_logits = all_logits;
    c.argmax = last ? argmax : nullptr;
    c.prefill = prefill;
    c.ordinal = solo ? uint64_t(m.n_past) : m.tokens_routed;
    m.pass->forward_chunk(c, solo ? *solo : m.routing, m.times, m.cache_aware_stats);
    // Before the logits leave: a page of a mapped file that faulted (read as zeros) or a file
    // changed since it was mapped fails the call; n_past stays, so nothing of it is kept.
    check_mapped_files(m.mapping_owner);
    m.tokens_routed += uint64_t(T);
    m.horizon.wrote(m.n_past, T);
    m.n_past += T;
  }
}

int Model::max_sequences() const { return impl_->slots.max_sequences(); }
int Model::max_batch() const { return impl_->opts.max_batch; }
int Model::create_sequence() { return impl_->slots.create(); }
void Model::free_sequence(int sequence) {
  impl_->slots.free(sequence);
  if (size_t(sequence) < impl_->sequence_routing.size()) impl_->sequence_routing[size_t(sequence)] = {};
}
int Model::sequence_n_past(int sequence) const { return impl_->slots.n_past(sequence); }
void Model::truncate_sequence(int sequence, int n_tokens) { impl_->slots.truncate(sequence, n_tokens); }

void Model::forward_batch(std::span<const SequenceInput> batch) {
  Impl& m = *impl_;
  if (m.routing.override)
    throw ConfigError("forward_batch: the model-wide routing override (set_routing_override) has one "
                      "clock for one sequence; replay per sequence with set_sequence_routing");
  const ForwardBatch b = m.slots.plan(batch, m.batch_entries);
  for (BatchEntry& e : m.batch_entries) {  // each sequence's replay, on its own clock (the position)
    const size_t s = size_t(e.slot);
    e.override = s < m.sequence_routing.size() && m.sequence_routing[s] ? &m.sequence_routing[s] : nullptr;
    if (e.override == nullptr) continue;
    e.chunk.ordinal = uint64_t(e.chunk.n_past);
    if (m.routing.cache_aware.enabled)
      throw ConfigError("forward_batch: sequence " + std::to_string(e.slot) + " replays its routing, which "
                        "excludes cache-aware routing (the replay fixes the experts)");
  }
  m.pass->forward_batch(b, m.routing, m.times, m.cache_aware_stats);
  check_mapped_files(m.mapping_owner);  // as forward's, before any sequence advances
  m.tokens_routed += uint64_t(b.n_tokens());
  m.slots.advance(batch);
}

}  // namespace moestream
