// The GPU expert cache tests' fixture (tests/gpu_expert_cache_test.cpp,
// tests/gpu_expert_cache_prefetch_test.cpp): a small model's stores (tests/gpu_cache_test_stores.h),
// a non-blocking stream, and a check that device bytes equal the store's payload. Built against
// the CUDA runtime on the device and tests/fake_cuda_runtime.cpp in CI.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/gpu_ops.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "tests/gpu_cache_test_stores.h"

#define SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                   \
    const char* why = "";                                                                \
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

namespace moestream::gpu_cache_test {

class GpuExpertCacheTest : public ::testing::Test {
 public:  // kernels_still_queued() shares the fixture
  void SetUp() override {
    const char* why = "";
    if (gpu::device_count(&why) == 0) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  // The device bytes at `dev` equal the store's payload of (layer, e).
  ::testing::AssertionResult matches(const uint8_t* dev, int layer, int e) {
    if (!dev) return ::testing::AssertionFailure() << "null device pointer for " << layer << "/" << e;
    std::vector<uint8_t> host(bytes_);
    if (cudaMemcpy(host.data(), dev, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMemcpy failed";
    if (host != store_.payload(layer, e))
      return ::testing::AssertionFailure() << "device bytes differ for layer " << layer << " expert " << e;
    return ::testing::AssertionSuccess();
  }

  // A step's use of `ids` of `layer`: acquired (`fill`) and the kernels that read them enqueued;
  // their device pointers.
  static std::vector<const uint8_t*> use(GpuExpertCache& cache, int layer, const std::vector<int>& ids,
                                         CacheFill fill = CacheFill::kDemand) {
    std::vector<const uint8_t*> dev(ids.size());
    cache.acquire(layer, ids, fill, dev);
    cache.kernels_enqueued();
    return dev;
  }

  // Options with the prefetch worker's store (the fixture's, open, unless a test gives its own).
  GpuExpertCacheOptions with_worker() { return with_worker(pf_store_); }
  static GpuExpertCacheOptions with_worker(ExpertStore& prefetch_store) {
    GpuExpertCacheOptions o;
    o.prefetch_store = &prefetch_store;
    return o;
  }

  ModelConfig cfg_ = small_config();
  size_t bytes_ = expert_bytes(cfg_);
  FakeStore store_{cfg_};
  GatedStore pf_store_{cfg_, true};  // same payloads (same seed), read on the worker thread
  cudaStream_t stream_ = nullptr;
};

}  // namespace moestream::gpu_cache_test
