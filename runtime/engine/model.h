// A loaded packed model: its expert store, KV bookkeeping and one forward pass, the CPU's
// (runtime/model/cpu_forward.h) or the GPU's (runtime/gpu/gpu_forward.h). Public API of the
// runtime; plain C++ (Eigen and CUDA stay inside).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "loader/format/model_config.h"
#include "loader/store/expert_store.h"
#include "loader/store/store_options.h"
#include "runtime/engine/sequence_input.h"
#include "runtime/gpu/gpu_stats.h"  // GpuForwardInfo/Stats, gpu_unavailable_reason()
#include "runtime/model/cache_aware_options.h"
#include "runtime/model/forward_types.h"  // ForwardTimes, RoutingEvent, RoutingCallback
#include "runtime/model/routing_override.h"

namespace moestream {

struct ModelOptions {
  int n_threads = 0;       // threads for dense and expert math, the caller included; 0 = all cores
  int max_context = 0;     // KV cache length; 0 = min(max_position_embeddings, 4096)
  int max_batch = 64;      // tokens per internal forward chunk (bounds scratch memory)
  bool verify_checksums = true;  // check each expert's XXH64 when read from the device (verified_pages.h)
  CacheAwareOptions cache_aware;  // substitute resident experts within a tolerance; off by default
  // The whole forward pass on the GPU (runtime/gpu/gpu_forward.h); ConfigError at load on a build
  // without CUDA or a machine without a GPU, never a silent CPU fallback.
  bool gpu = false;
  size_t gpu_cache_mb = 0;  // GPU expert cache budget in MiB; 0 = automatic (gpu_forward.h)
  int moe_lookahead = 0;    // experts of layer L+1 prefetched during layer L (GPU cache, or the store's host tiers on the CPU)
  bool gpu_sync_layers = false;  // GpuForwardOptions::resident_decode off (comparisons)
  // Every expert into the GPU cache at load (GpuForwardOptions::preload); progress per MoE layer.
  bool gpu_preload = false;
  bool gpu_no_graphs = false;  // GpuForwardOptions::graphs off (comparisons)
  bool gpu_pin_page_cache = false;  // GpuForwardOptions::pin_page_cache
  bool gpu_cpu_misses = false;      // GpuForwardOptions::cpu_misses (the model's pool computes them)
  std::function<void(int, int)> on_gpu_preload;
  // CPU look-ahead (issue 19): with a routing override (a replay), predict layer L+1 from the
  // override rather than its router: a perfect predictor, for benchmarks' upper bound.
  bool moe_lookahead_replayed = false;
  // Batches (create_sequence, forward_batch): sequence slots, each with its own KV cache of
  // max_context positions, allocated on the slot's first use (address space until written).
  int max_sequences = 8;
};

// The front ends' default chunk (infer --batch 0, Python batch=0): 64 tokens on the CPU; 512
// with the GPU, whose prefill reads each expert a chunk routes to once per chunk (from the page
// cache or the disk, over PCIe), so longer chunks read each expert less often (llama.cpp's
// micro-batch is 512 tokens too). The GPU's activations grow with it (about 0.9 MB per token at
// Qwen3-30B-A3B's shapes, most of it the chunk's logits rows).
inline int default_max_batch(bool gpu) { return gpu ? 512 : 64; }

// The store options a model loaded with `opts` needs, from the front end's `c`: opts' checksum
// choice, and no automatic O_DIRECT beside gpu_pin_page_cache (the pin locks the page cache's own
// pages, and refuses itself, naming why, a model larger than memory). Every front end's store
// (infer, the server, Python, Model::load's default) is opened with what this returns.
StoreConfig store_config_for(const ModelOptions& opts, StoreConfig c);

class Model {
 public:
  // Reads dir/model.json and the dense weights, opens infer's default expert store (the read
  // engine, --io auto; loader/store/store_options.h) with opts.verify_checksums. Throws
  // ConfigError/FormatError/IoError naming the file and field.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& opts = {});
  // Same, with a caller-supplied expert store (another tier, or a fault-injecting one in tests).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelOptions& opts,
                                     std::unique_ptr<ExpertStore> store);
  ~Model();

  const ModelConfig& config() const;
  int n_threads() const;
  int max_context() const;
  int n_past() const;  // tokens in the KV cache

  // Runs `tokens` at positions n_past()..n_past()+T-1 and appends them to the KV cache. Writes the
  // logits of the last token (vocab_size floats) or, when all_logits, of every token (T rows).
  // Throws ConfigError for a token id outside the vocabulary or a full context.
  void forward(std::span<const int> tokens, std::span<float> logits, bool all_logits = false);
  // The same step for greedy decoding: returns Sampler::argmax of the last token's logits. The
  // GPU pass picks it on the device and copies back the id alone, not vocab_size floats.
  int forward_argmax(std::span<const int> tokens);
  // Empties the KV cache.
  void reset();
  // Keeps the first n_tokens of the KV cache (0 <= n_tokens <= n_past()), so a caller can reuse
  // a common prefix; ConfigError otherwise. With sliding-window layers (gpt-oss), whose KV is a
  // ring of window + max_batch - 1 positions, a rewind whose window was overwritten since keeps
  // nothing: callers read n_past() after it.
  void truncate(int n_tokens);
  // Called after every layer's routing (empty = none); observing never changes the output.
  void set_routing_callback(RoutingCallback cb);
  // Expert choice from `fn` instead of the router (an empty fn restores the router), e.g. a
  // RoutingReplay; cache-aware substitution is skipped while it is set. Both backends.
  void set_routing_override(RoutingOverrideFn fn);
  bool routing_overridden() const;
  // Routing replayed per sequence (concurrent requests, each its own traffic): `fn` chooses the
  // experts of `sequence`'s tokens (a live id of create_sequence, or -1 for forward()'s own
  // sequence) instead of the router, called with ordinal = the position of the chunk's first
  // token in that sequence, not set_routing_override's model-wide clock. An empty fn gives the
  // router back; free_sequence clears it. ConfigError for a sequence not live, for -1 while
  // set_routing_override is set, and for a batch sequence on the GPU pass (its batches take the
  // router's choice). forward_batch refuses it beside cache-aware routing.
  void set_sequence_routing(int sequence, RoutingOverrideFn fn);

  // Batches of sequences (continuous batching; the CPU pass and the GPU's). Sequences
  // are separate from forward()'s, each with its own KV slot and position. forward_batch runs one
  // step: every entry's tokens (a decode token, or a prefill chunk) at its sequence's position,
  // all in one pass whose tokens sum to at most max_batch; each layer fetches the union of the
  // experts its tokens select once. Each sequence's logits equal those of the same chunks run
  // alone through forward() (bitwise on the CPU; on the GPU within a stated tolerance, gpu_forward.h),
  // with a sequence's replayed routing (set_sequence_routing) too. ConfigError on an unknown or
  // repeated sequence, empty input, a full context, or set_routing_override's model-wide replay
  // (replays in batches are per sequence).
  int max_sequences() const;
  int max_batch() const;  // tokens per forward_batch step (ModelOptions::max_batch, <= context)
  int create_sequence();            // a free slot, reused after free_sequence()
  void free_sequence(int sequence);
  int sequence_n_past(int sequence) const;
  void truncate_sequence(int sequence, int n_tokens);  // keeps a prefix, as truncate()
  void forward_batch(std::span<const SequenceInput> batch);

  const ForwardTimes& times() const;
  void reset_times();
  // Cache-aware routing, changeable between forward calls (e.g. per server request); the
  // counters run across calls until reset. Both backends: on the GPU an expert is resident when
  // the GPU expert cache holds it or the store's host tiers do.
  void set_cache_aware(const CacheAwareOptions& opts);
  const CacheAwareOptions& cache_aware() const;
  const CacheAwareStats& cache_aware_stats() const;
  void reset_cache_aware_stats();
  ExpertStoreStats expert_stats() const;
  const ExpertStore& expert_store() const;  // e.g. to ask residency() or describe()
  // Bytes of weights read per decoded token: dense weights as stored (one embedding row, not the
  // table, unless tied) plus top-k experts per layer in their stored size.
  size_t active_bytes_per_token() const;
  // The GPU backend (ModelOptions::gpu): what it holds (nullptr without it), and its expert-cache
  // and look-ahead counters since the last reset (zeros without it).
  const GpuForwardInfo* gpu_info() const;
  GpuForwardStats gpu_stats() const;
  void reset_gpu_stats();

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
