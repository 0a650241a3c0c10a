// The decoder forward pass on the CPU: dense weights in RAM (Eigen), experts fetched per layer
// from an ExpertStore through the MoE layer, the KV cache in RAM. One of Model's ForwardPasses.
#pragma once

#include <filesystem>
#include <memory>

#include "common/thread_pool.h"
#include "loader/format/model_config.h"
#include "loader/store/expert_store.h"
#include "runtime/model/forward_pass.h"

namespace moestream {

class CpuForward final : public ForwardPass {
 public:
  // Loads the dense weights (dense_path, dense.safetensors) as f32 and sizes the KV cache for
  // max_context positions and the scratch for chunks of max_batch tokens. `cfg`, `store` and
  // `pool` are not owned and outlive the pass. Throws FormatError/IoError naming the file.
  CpuForward(const ModelConfig& cfg, const std::filesystem::path& dense_path, ExpertStore& store,
             ThreadPool& pool, int max_context, int max_batch);
  ~CpuForward() override;
  CpuForward(const CpuForward&) = delete;
  CpuForward& operator=(const CpuForward&) = delete;

  // Cache-aware residency: the store's tiers (any but kStorage).
  void forward_chunk(const ForwardChunk& chunk, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override;
  // Batches of sequences, each with its own attention state (a batch step of the layer stack); the slots are
  // separate from forward_chunk's sequence.
  void forward_batch(const ForwardBatch& batch, const RoutingControl& routing, ForwardTimes& times,
                     CacheAwareStats& cache_aware) override;

  // Look-ahead (issue 19, --moe-lookahead N): during each decode step's layer L, predict layer
  // L+1's N most likely experts and have the store read them ahead (Lookahead in blocks.h).
  // 0 = off. ConfigError outside [0, n_experts]. Never changes the output. `from_override`:
  // with a routing override, predict from it (Lookahead::from_override).
  void set_moe_lookahead(int n, bool from_override = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
