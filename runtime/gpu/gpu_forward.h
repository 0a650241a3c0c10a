// The whole decoder forward pass on one GPU (`infer --gpu`): dense weights and the KV cache in
// VRAM, cuBLAS projections, our kernels, experts through the GpuExpertCache. Plain C++ header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "loader/store/expert_store.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "loader/format/model_config.h"
#include "runtime/model/routing_override.h"

namespace moestream {

struct ForwardTimes;
struct RoutingEvent;

struct GpuForwardOptions {
  int max_context = 0;        // KV cache positions (resolved by Model::load)
  int max_batch = 64;         // tokens per forward chunk
  size_t cache_mb = 0;        // GPU expert cache budget in MiB; 0 = auto (see budget rule below)
  int moe_lookahead = 0;      // experts of layer L+1 predicted and prefetched during layer L
};

// Look-ahead accuracy, decode only: at layer L+1, how many of the demanded experts (distinct
// top-k ids of the token) were among the `moe_lookahead` experts predicted during layer L.
struct GpuLookaheadStats {
  uint64_t layers = 0;          // layer steps that had a prediction
  uint64_t predicted = 0;       // ids handed to GpuExpertCache::prefetch
  uint64_t demanded = 0;        // demanded experts of those layer steps
  uint64_t demanded_predicted = 0;  // of those, in the prediction
  double recall() const { return demanded > 0 ? double(demanded_predicted) / double(demanded) : 0; }
};

struct GpuForwardStats {
  GpuCacheTelemetry cache;
  GpuLookaheadStats lookahead;
};
// a - b field by field (counters since a snapshot); used for the decode share of a run.
GpuForwardStats operator-(const GpuForwardStats& a, const GpuForwardStats& b);

// What the GPU backend holds, for the startup line and --stats-json.
struct GpuForwardInfo {
  std::string device;            // e.g. "NVIDIA H200"
  size_t dense_bytes = 0;        // f32 dense weights on the device
  size_t kv_bytes = 0;           // KV cache
  size_t scratch_bytes = 0;      // activations
  size_t expert_bytes_total = 0; // all experts of the model, packed
  size_t free_bytes_before_cache = 0;
  size_t cache_bytes = 0;        // GPU expert cache budget in effect
  std::string cache_rule;        // how the budget was chosen
  int moe_lookahead = 0;
  std::string describe() const;  // one line
};

class GpuForward {
 public:
  // Uploads the dense weights (streamed from dense_path, dense.safetensors), allocates the KV cache and scratch, then the expert cache under
  // the budget rule: opts.cache_mb when given, else the whole model's experts when they fit in
  // 80% of the free VRAM, else 80% of the free VRAM. Throws ConfigError when no GPU is usable,
  // for f32 experts (no GPU kernel) or a budget below one expert; Error on CUDA failures.
  GpuForward(const ModelConfig& cfg, const std::filesystem::path& dense_path, ExpertStore& store,
             const GpuForwardOptions& opts);
  ~GpuForward();
  GpuForward(const GpuForward&) = delete;
  GpuForward& operator=(const GpuForward&) = delete;

  // Runs T <= max_batch tokens at positions n_past..n_past+T-1 (KV rows appended on the device)
  // and writes the logits of the last token, or of every token when all_logits, to host memory
  // (nullptr: none). T > 1 fills experts with CacheFill::kPrefill, T == 1 with kDemand. Each
  // layer's routing goes to on_routing when set (router inputs copied back only then). When
  // `override` is set and non-empty it replaces the router's ids/weights (token t of the chunk
  // is ordinal + t), as on the CPU. `times` gets host wall time per phase between
  // synchronisation points (see docs/gpu.md).
  void forward_chunk(const int* tokens, int T, int n_past, float* logits, bool all_logits,
                     bool prefill, const std::function<void(const RoutingEvent&)>& on_routing,
                     ForwardTimes& times, const RoutingOverrideFn* override = nullptr,
                     uint64_t ordinal = 0);

  GpuForwardStats stats() const;
  void reset_stats();
  const GpuForwardInfo& info() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
