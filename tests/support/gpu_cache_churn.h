// A GpuExpertCache too small for a model's experts, churned over its first two layers: every
// pointer it hands out must hold the bytes the store reads (shared by the GPU GGUF tests).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <vector>

#include "loader/store/engine_expert_store.h"
#include "runtime/gpu/gpu_expert_cache.h"

namespace moestream::test {

// Layers 0 and 1 take turns for 40 steps, two of experts 0..3 a step, through a budget of three of
// the largest experts: the layers take each other's slots. Every handed-out pointer is 16-byte
// aligned and holds what a second store fetches; the budget must fill (evictions > 0).
inline void expect_small_gpu_cache_holds_store_bytes(const std::filesystem::path& file, const ModelConfig& c) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  {
    auto store = open_engine_expert_store(file, c);
    auto reference = open_engine_expert_store(file, c);
    GpuExpertCache cache(c, *store, 3 * c.max_expert_bytes() + 64, s);
    std::vector<const uint8_t*> dev(2), host;
    for (int step = 0; step < 40; ++step) {
      const int layer = step % 2;
      const std::vector<int> ids{step % 4, (step / 2 + 1) % 4};
      cache.acquire(layer, ids, CacheFill::kDemand, dev);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(cache.expert_bytes(layer), c.expert_layout(layer).bytes);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(dev[i]) % 16, 0u) << "expert payload not 16-byte aligned";
        reference->fetch(layer, std::span<const int>(&ids[i], 1), host);
        std::vector<uint8_t> got(cache.expert_bytes(layer));
        ASSERT_EQ(cudaMemcpy(got.data(), dev[i], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(std::memcmp(got.data(), host[0], got.size()), 0)
            << "layer " << layer << " expert " << ids[i] << " at step " << step;
      }
      cache.kernels_enqueued();
      cache.end_step();
    }
    EXPECT_GT(cache.telemetry().policy.evictions, 0u) << "the budget never filled: the test is too easy";
  }
  cudaStreamDestroy(s);
}

}  // namespace moestream::test
