// The GPU expert cache's prefetch worker (runtime/gpu/gpu_expert_cache.h): predictions dropped
// against a warm set, used by a later demand, never evicting a queued demand's experts; prefetch
// returns before its read and a demand waits for the worker; cancelled, demanded-while-queued and
// already-copied predictions; the worker's read errors; staging never overwritten under a copy.
// Also built into gpu_expert_cache_fake_test (tests/fake_cuda_runtime.cpp, CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/gpu_ops.h"
#include "runtime/gpu/gpu_expert_cache.h"
#include "tests/gpu_expert_cache_fixture.h"

namespace moestream {
namespace {

using namespace gpu_cache_test;

TEST_F(GpuExpertCacheTest, PredictionOfColdExpertsIsDroppedAgainstAWarmSet) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 2 * bytes_, stream_, with_worker());
  std::vector<int> warm{0, 1};
  std::vector<const uint8_t*> dev(2);
  for (int step = 0; step < 6; ++step) {  // heat 6: 4*6 > 5*0 + 16, the guard holds
    cache.acquire(2, warm, CacheFill::kDemand, dev);
    cache.kernels_enqueued();
    cache.end_step();
  }
  CUDA_OK(cudaStreamSynchronize(stream_));
  const GpuCacheTelemetry before = cache.telemetry();
  std::vector<int> predicted{2, 3, -1, 16};
  cache.prefetch(2, predicted);
  const GpuCacheTelemetry after = cache.telemetry();
  EXPECT_EQ(after.prefetch_dropped - before.prefetch_dropped, 2u);
  EXPECT_EQ(after.prefetch_ignored - before.prefetch_ignored, 2u);
  EXPECT_EQ(after.prefetch_issued, before.prefetch_issued);
  EXPECT_EQ(after.h2d_copies, before.h2d_copies);
  EXPECT_EQ(after.policy.evictions, before.policy.evictions);
  EXPECT_TRUE(matches(cache.resident_payload(2, 0), 2, 0));
  EXPECT_TRUE(matches(cache.resident_payload(2, 1), 2, 1));
  EXPECT_EQ(cache.resident_payload(2, 2), nullptr);
}

TEST_F(GpuExpertCacheTest, PrefetchedExpertIsUsedByALaterDemand) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 4 * bytes_, stream_, with_worker());
  std::vector<int> predicted{6, 4};
  cache.prefetch(1, predicted);  // no sync: the demand below must wait for these copies
  pf_store_.wait_entered(1);     // begun reading: the demand cannot take it back
  std::vector<int> ids{4};
  std::vector<const uint8_t*> dev(1);
  cache.acquire(1, ids, CacheFill::kDemand, dev);
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.h2d_bytes, t.prefetch_h2d_bytes);  // a hit: no copy of its own
  EXPECT_EQ(t.prefetch_issued, 2u);
  EXPECT_EQ(t.prefetch_used, 1u);
  EXPECT_EQ(store_.stats().experts_requested, 0u);  // read by the worker only, never twice
  CUDA_OK(cudaStreamSynchronize(stream_));  // only `compute`: it waited for the prefetch's event
  EXPECT_TRUE(matches(dev[0], 1, 4));
}

TEST_F(GpuExpertCacheTest, PredictionsQueuedWithADemandNeverEvictItsExperts) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache full(cfg_, store_, 2 * bytes_, stream_, with_worker());
  std::vector<int> ids{0, 1}, next{2, 3};
  std::vector<const uint8_t*> dev(2);
  full.acquire_and_prefetch(0, ids, CacheFill::kDemand, dev, 1, next);  // both slots are this call's
  full.kernels_enqueued();
  EXPECT_EQ(full.telemetry().prefetch_issued, 0u);
  EXPECT_EQ(full.telemetry().policy.speculative_no_room, 2u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 0, 0));
  EXPECT_TRUE(matches(dev[1], 0, 1));

  GpuExpertCache roomy(cfg_, store_, 4 * bytes_, stream_, with_worker());
  const uint64_t read_before = store_.stats().experts_requested;
  roomy.acquire_and_prefetch(0, ids, CacheFill::kDemand, dev, 1, next);
  roomy.kernels_enqueued();
  EXPECT_EQ(roomy.telemetry().prefetch_issued, 2u);
  pf_store_.wait_entered(1);
  roomy.acquire(1, next, CacheFill::kDemand, dev);  // from the worker: hits, no demand read
  EXPECT_EQ(store_.stats().experts_requested - read_before, 2u);
  EXPECT_EQ(roomy.telemetry().prefetch_used, 2u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 1, 2));
  EXPECT_TRUE(matches(dev[1], 1, 3));
}

TEST_F(GpuExpertCacheTest, PrefetchWithoutAPrefetchStoreIsConfigError) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 4 * bytes_, stream_);
  std::vector<int> predicted{1};
  EXPECT_THROW(cache.prefetch(0, predicted), ConfigError);
}

TEST_F(GpuExpertCacheTest, PrefetchReturnsBeforeItsReadAndDemandWaitsForTheWorker) {
  SKIP_WITHOUT_GPU();
  GatedStore gated(cfg_);
  GpuExpertCache cache(cfg_, store_, 4 * bytes_, stream_, with_worker(gated));
  std::vector<int> predicted{6, 4};
  // The worker blocks in the store's begin_fetch until gated.open() below: a prefetch that
  // waited for its read would never return, so getting past it is the check (no clock needed).
  cache.prefetch(1, predicted);
  gated.wait_entered(1);  // begun reading: a demand now waits instead of taking it back
  EXPECT_EQ(cache.telemetry().prefetch_issued, 2u);
  EXPECT_EQ(cache.telemetry().prefetch_h2d_bytes, 0u);  // nothing read yet, so nothing copied
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gated.open();
  });
  std::vector<int> ids{4};
  std::vector<const uint8_t*> dev(1);
  cache.acquire(1, ids, CacheFill::kDemand, dev);  // waits for the worker, does not read again
  opener.join();
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.prefetch_waits, 1u);
  EXPECT_GT(t.prefetch_wait_s, 0.0);
  EXPECT_EQ(t.policy.demand_hits, 1u);
  EXPECT_EQ(store_.stats().experts_requested, 0u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 1, 4));
}

TEST_F(GpuExpertCacheTest, UnaskedPredictionsAreCancelledAndReadOnlyWhenDemandedLater) {
  SKIP_WITHOUT_GPU();
  GatedStore gated(cfg_);
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, with_worker(gated));
  std::vector<int> p0{1}, p1{5, 6};
  cache.prefetch(0, p0);  // the worker takes this group and blocks reading it
  gated.wait_entered(1);
  cache.prefetch(1, p1);  // queued behind it
  std::vector<int> d1{7};
  std::vector<const uint8_t*> dev(1);
  cache.acquire(1, d1, CacheFill::kDemand, dev);  // 5 and 6 were not asked for: cancelled
  cache.kernels_enqueued();
  EXPECT_EQ(cache.telemetry().prefetch_cancelled, 2u);
  EXPECT_EQ(store_.stats().experts_requested, 1u);  // 7 through the demand store
  gated.open();
  std::vector<int> d0{1};
  cache.acquire(0, d0, CacheFill::kDemand, dev);  // the prediction, read by the worker
  cache.kernels_enqueued();
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 0, 1));
  EXPECT_EQ(gated.layers_fetched(), std::vector<int>{0});  // the cancelled group was never read
  std::vector<int> d5{5};
  cache.acquire(1, d5, CacheFill::kDemand, dev);  // a cancelled prediction: read now, a miss
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 1, 5));
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(store_.stats().experts_requested, 2u);
  EXPECT_EQ(t.prefetch_refills, 1u);
  EXPECT_EQ(t.policy.demand_misses, 2u);  // 7 and the refill of 5
  EXPECT_EQ(t.policy.demand_hits, 1u);    // 1
  EXPECT_EQ(t.prefetch_used, 1u);
}

TEST_F(GpuExpertCacheTest, DemandedPredictionStillQueuedIsReadByDemandWithoutWaiting) {
  SKIP_WITHOUT_GPU();
  GatedStore gated(cfg_);
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, with_worker(gated));
  std::vector<int> p0{1}, p1{2, 3};
  cache.prefetch(0, p0);
  gated.wait_entered(1);  // the worker is stuck on layer 0
  cache.prefetch(1, p1);
  std::vector<int> d1{2};
  std::vector<const uint8_t*> dev(1);
  cache.acquire(1, d1, CacheFill::kDemand, dev);  // 2 taken back and read here, 3 cancelled
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.prefetch_waits, 0u);
  EXPECT_EQ(t.prefetch_refills, 1u);
  EXPECT_EQ(t.prefetch_cancelled, 1u);
  EXPECT_EQ(t.policy.demand_misses, 1u);
  EXPECT_EQ(store_.stats().experts_requested, 1u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 1, 2));
  gated.open();
  cache.kernels_enqueued();
  std::vector<int> d0{1};
  cache.acquire(0, d0, CacheFill::kDemand, dev);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 0, 1));
  EXPECT_EQ(gated.layers_fetched(), std::vector<int>{0});  // layer 1's group was never read
}

TEST_F(GpuExpertCacheTest, WorkerReadErrorIsThrownByTheNextCallAndTheCacheRecovers) {
  SKIP_WITHOUT_GPU();
  GatedStore failing(cfg_);
  failing.open();
  failing.fail_layer_ = 2;
  GpuExpertCacheOptions o;
  o.prefetch_store = &failing;
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, o);
  std::vector<int> predicted{3, 9};
  cache.prefetch(2, predicted);
  failing.wait_entered(1);  // the worker holds the group: the demand cannot take 3 back
  std::vector<int> ids{3};
  std::vector<const uint8_t*> dev(1);
  try {
    cache.acquire(2, ids, CacheFill::kDemand, dev);  // waits for the failed prediction
    FAIL() << "expected the worker's IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_2.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.resident_payload(2, 9), nullptr);  // flushed: no slot without its bytes
  cache.acquire(2, ids, CacheFill::kDemand, dev);      // through the demand store now
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(dev[0], 2, 3));
}

TEST_F(GpuExpertCacheTest, BackToBackPrefetchesNeverOverwriteStagingACopyStillReads) {
  SKIP_WITHOUT_GPU();
  GpuExpertCacheOptions o = with_worker();
  o.prefetch_staging_bytes = 2 * bytes_;  // each prefetch below wraps the worker's ring
  GpuExpertCache cache(cfg_, store_, 16 * bytes_, stream_, o);
  std::vector<int> ids{4, 0, 3, 1, 2};
  for (int layer = 0; layer < 3; ++layer) cache.prefetch(layer, ids);  // no sync in between
  EXPECT_EQ(cache.telemetry().prefetch_issued, 15u);
  pf_store_.wait_entered(3);
  for (int layer = 0; layer < 3; ++layer) {  // each demand waits for its predictions' copies
    std::vector<const uint8_t*> dev(ids.size());
    cache.acquire(layer, ids, CacheFill::kDemand, dev);
    cache.kernels_enqueued();
    CUDA_OK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(matches(dev[i], layer, ids[i]));
  }
  EXPECT_EQ(store_.stats().experts_requested, 0u);  // every expert came from the worker
  EXPECT_EQ(cache.telemetry().prefetch_h2d_bytes, 15 * bytes_);
}

TEST_F(GpuExpertCacheTest, PredictionAlreadyCopiedIsReadyAtBeginAcquire) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, with_worker());
  std::vector<int> pred{3, 4};
  cache.prefetch(1, pred);
  // Until the worker has issued both copies (it holds no gate: pf_store_ is open).
  for (int i = 0; i < 10000 && cache.telemetry().prefetch_h2d_bytes < 2 * bytes_; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(cache.telemetry().prefetch_h2d_bytes, 2 * bytes_);
  std::vector<int> ids{4, 8};
  std::vector<const uint8_t*> got(2);
  std::vector<uint8_t> ready(2);
  cache.begin_acquire(1, ids, CacheFill::kDemand, got, ready);
  EXPECT_EQ(ready, (std::vector<uint8_t>{1, 0}));
  std::vector<uint8_t> host(bytes_);
  CUDA_OK(cudaMemcpyAsync(host.data(), got[0], bytes_, cudaMemcpyDeviceToHost, stream_));
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(host, store_.payload(1, 4));  // compute waited for the worker's copy
  cache.finish_acquire();
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(got[1], 1, 8));
  EXPECT_EQ(cache.telemetry().prefetch_waits, 0u);
  cache.kernels_enqueued();
}

}  // namespace
}  // namespace moestream
