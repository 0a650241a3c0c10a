// A loaded packed model ready for the CPU forward pass: dense weights in RAM, experts fetched per
// layer from an ExpertStore, a KV cache. Public API of the runtime; plain C++ (Eigen stays inside).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "runtime/model/cache_aware_router.h"
#include "loader/store/expert_store.h"
#include "runtime/gpu/gpu_forward.h"
#include "loader/format/model_config.h"
#include "runtime/model/routing_override.h"

namespace moestream {

struct ModelOptions {
  int n_threads = 0;       // threads for dense and expert math, the caller included; 0 = all cores
  int max_context = 0;     // KV cache length; 0 = min(max_position_embeddings, 4096)
  int max_batch = 64;      // tokens per internal forward chunk (bounds scratch memory)
  bool verify_checksums = true;  // check each expert's XXH64 on every read
  CacheAwareOptions cache_aware;  // substitute resident experts within a tolerance; off by default
  // The whole forward pass on the GPU (runtime/gpu/gpu_forward.h); ConfigError at load on a build
  // without CUDA or a machine without a GPU, never a silent CPU fallback.
  bool gpu = false;
  size_t gpu_cache_mb = 0;  // GPU expert cache budget in MiB; 0 = automatic (gpu_forward.h)
  int moe_lookahead = 0;    // experts of layer L+1 prefetched during layer L; > 0 needs gpu
};

// Wall seconds per phase, summed over forward calls since the last reset_phase_times().
struct ForwardTimes {
  double attention_s = 0;        // QKV/O projections, QK-norm, RoPE, attention
  double router_s = 0;           // router logits, softmax, top-k
  double expert_io_s = 0;        // waiting for ExpertStore::fetch
  double expert_compute_s = 0;   // SwiGLU expert matvecs and the weighted sum
  double other_s = 0;            // embedding, norms, residuals, lm_head
  double total() const { return attention_s + router_s + expert_io_s + expert_compute_s + other_s; }
};

// One layer's routing decisions for a chunk of tokens, for routing logs (--collect-routing).
struct RoutingEvent {
  int layer = 0;
  int position = 0;      // position of the chunk's first token in the sequence
  int n_tokens = 0;
  int top_k = 0, hidden = 0;
  bool prefill = false;  // part of the first forward call after reset() (the prompt)
  const int* ids = nullptr;             // [n_tokens, top_k] logical ids, best first
  const float* weights = nullptr;       // [n_tokens, top_k]
  const float* router_inputs = nullptr; // [n_tokens, hidden]: the normalised rows the router saw
};
using RoutingCallback = std::function<void(const RoutingEvent&)>;

// Why ModelOptions::gpu cannot work here, "" when it can: a build without the CUDA tier, or no
// usable CUDA device (the driver's reason). Cheap: callers check it before a slow load.
std::string gpu_unavailable_reason();

// How a front end spells the GPU options, for its error messages (defaults: infer's flags).
struct GpuOptionNames {
  std::string gpu = "--gpu", gpu_cache_mb = "--gpu-cache-mb", moe_lookahead = "--moe-lookahead";
  std::string assign = " ";  // between an option and its value: "--moe-lookahead 4"
};
// Throws ConfigError for GPU options that cannot work: a negative look-ahead, look-ahead or a
// GPU cache size without gpu, gpu without a usable device. Model::load calls it; front ends call
// it before their own slow work so the error comes first and in their spelling.
void check_gpu_options(const ModelOptions& opts, const GpuOptionNames& names = {});

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
  // Empties the KV cache.
  void reset();
  // Keeps the first n_tokens of the KV cache (0 <= n_tokens <= n_past()), so a caller can reuse
  // a common prefix; ConfigError otherwise.
  void truncate(int n_tokens);
  // Called after every layer's routing (empty = none); observing never changes the output.
  void set_routing_callback(RoutingCallback cb);
  // Expert choice from `fn` instead of the router (an empty fn restores the router), e.g. a
  // RoutingReplay; cache-aware substitution is skipped while it is set. Both backends.
  void set_routing_override(RoutingOverrideFn fn);
  bool routing_overridden() const;

  const ForwardTimes& times() const;
  void reset_times();
  // Cache-aware routing, changeable between forward calls (e.g. per server request); the
  // counters run across calls until reset.
  void set_cache_aware(const CacheAwareOptions& opts);
  const CacheAwareOptions& cache_aware() const;
  const CacheAwareStats& cache_aware_stats() const;
  void reset_cache_aware_stats();
  ExpertStoreStats expert_stats() const;
  const ExpertStore& expert_store() const;  // e.g. to ask residency() or describe()
  // Bytes of weights read per decoded token: dense f32 weights (one embedding row, not the table,
  // unless tied) plus top-k experts per layer in their packed size.
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
