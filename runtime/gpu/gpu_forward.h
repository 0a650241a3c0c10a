// The whole decoder forward pass on one GPU (`infer --gpu`), of a pack or a GGUF: dense weights
// in their stored types and the KV cache in VRAM, f32 projections through cuBLAS, every other
// type and the rest through our kernels, experts through the GpuExpertCache. Plain C++ header;
// gpu_forward.cpp implements it with CUDA, gpu_unavailable.cpp says why a build cannot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "common/thread_pool.h"
#include "loader/store/expert_store.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "runtime/gpu/gpu_stats.h"
#include "loader/format/model_config.h"
#include "runtime/model/forward_pass.h"

namespace moestream {

struct GpuForwardOptions {
  int max_context = 0;        // KV cache positions (resolved by Model::load)
  int max_batch = 64;         // tokens per forward chunk
  size_t cache_mb = 0;        // GPU expert cache budget in MiB; 0 = auto (see budget rule below)
  int moe_lookahead = 0;      // experts of layer L+1 predicted and prefetched during layer L
  // Decode steps whose experts were all resident last step run with no host sync per layer
  // (docs/gpu.md "Resident decode"); false: every layer syncs (the path before issue 19; for
  // comparison). Both give the same bits.
  bool resident_decode = true;
  // The resident step's kernels run as CUDA graphs, one per layer and one for lm_head
  // (runtime/gpu/gpu_graphs.h); false: launched one by one (`--gpu-no-graphs`, for comparison).
  // The same bits either way.
  bool graphs = true;
  // Page-lock the store's file mappings so misses are copied from the page cache with no host
  // copy (GpuExpertCacheOptions::pin_page_cache; `--gpu-pin-page-cache`): the files stay in RAM.
  bool pin_page_cache = false;
  // Before the first token, read every expert of the model into the GPU cache (layer by layer,
  // kPrefill: nothing evicted), as an engine that holds all weights in VRAM loads them at start.
  // ConfigError when the cache's budget cannot hold them all. `on_preload(layers done, layers)`
  // reports progress after each MoE layer when set.
  bool preload = false;
  std::function<void(int, int)> on_preload;
  // Decode experts the VRAM cache does not hold are computed on the CPU, on cpu_pool's threads,
  // from their matrices where the store has them (in place in the page cache; else read), while
  // the GPU computes the hits; only their outputs cross PCIe (`--gpu-cpu-misses`; docs/gpu.md,
  // "Misses on the CPU"). Nothing is placed in VRAM for them: what the cache holds is what
  // prefill or --gpu-preload placed. Needs cpu_pool (not owned; outlives the pass).
  bool cpu_misses = false;
  ThreadPool* cpu_pool = nullptr;
};

class GpuForward : public ForwardPass {
 public:
  // Uploads the dense weights (dense_path: dense.safetensors or the GGUF, loaded as the CPU pass
  // loads it, copied in their stored types), allocates the KV cache and scratch, then the expert
  // cache under the budget rule: opts.cache_mb when given, else the whole model's experts when
  // they fit in 80% of the free VRAM, else 80% of the free VRAM. Runs every dense and expert
  // matrix once (warm-up). Throws ConfigError when no GPU is usable (in a build without CUDA:
  // always, with gpu_unavailable_reason()), for a pack's f32 experts, a type the CUDA kernels do
  // not compute (naming the tensor) or a budget below one expert; Error on CUDA failures. `cfg` and `store` are not owned and outlive the pass.
  static std::unique_ptr<GpuForward> create(const ModelConfig& cfg,
                                            const std::filesystem::path& dense_path,
                                            ExpertStore& store, const GpuForwardOptions& opts);

  // A chunk of T tokens: KV rows appended on the device, the logits asked for copied to host
  // memory. T > 1 fills experts with CacheFill::kPrefill, T == 1 with kDemand. The router's ids
  // come to the host each layer; there the override replaces them (weights sent back), or
  // cache-aware routing substitutes against the GPU cache's residency and, below it, the
  // store's host tiers (router logits copied back only then). Router inputs are copied back for
  // on_routing only when it is set. `times`: host wall time per phase between synchronisation
  // points (see docs/gpu.md).
  void forward_chunk(const ForwardChunk& chunk, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override = 0;

  // Batches of sequences (Model::forward_batch, `moestream-server --gpu --parallel N`; docs/gpu.md
  // "Batches of sequences"): each slot's KV cache in VRAM, allocated on its first use outside the
  // expert cache's budget (ConfigError naming its size when it does not fit). Dense products over
  // all of the step's rows, attention per sequence, per MoE layer the union of the rows' experts
  // acquired once (kDemand when the step decodes a token, else kPrefill; hits first) and each
  // expert run over all of its rows. No look-ahead and no resident decode in a batch step: each
  // MoE layer syncs once for the whole step. A sequence's f32 cuBLAS products run over its own
  // rows (cuBLAS picks its algorithm by row count), so its logits are meant to be its bits alone;
  // tests assert a tolerance (docs/gpu.md). ConfigError for MLA.
  void forward_batch(const ForwardBatch& batch, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override = 0;

  virtual GpuForwardStats stats() const = 0;
  virtual void reset_stats() = 0;
  virtual const GpuForwardInfo& info() const = 0;
};

}  // namespace moestream
