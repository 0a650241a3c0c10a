// Tests of runtime/gpu/gpu_expert_cache.h on the device: bytes on the GPU equal the store's
// payloads, resident tracking, merged copies, kernels still queued under evictions, scratch,
// prefill fills, VRAM-pressure retry, experts of several sizes. The prefetch worker's tests:
// tests/gpu_expert_cache_prefetch_test.cpp. Both files are also built as
// gpu_expert_cache_fake_test against tests/fake_cuda_runtime.cpp (CI, no GPU).
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

TEST(GpuExpertCacheConfig, BudgetBelowOneExpertIsConfigError) {
  // Checked before any CUDA call: runs without a GPU too.
  const ModelConfig c = small_config();
  FakeStore store(c);
  EXPECT_THROW(GpuExpertCache(c, store, expert_bytes(c) - 1, nullptr), ConfigError);
}

TEST_F(GpuExpertCacheTest, DeviceBytesMatchPayloadsAfterRandomDemandPrefillPrefetch) {
  SKIP_WITHOUT_GPU();
  GpuExpertCacheOptions o = with_worker();
  o.chunk_bytes = 3 * bytes_;    // several chunks
  o.staging_bytes = 5 * bytes_;  // the ring wraps every few calls
  o.prefetch_staging_bytes = 3 * bytes_;
  GpuExpertCache cache(cfg_, store_, 10 * bytes_, stream_, o);
  std::mt19937 rng(7);
  for (int it = 0; it < 600; ++it) {
    const int layer = int(rng() % 3);
    const int op = int(rng() % 4);
    if (op == 3) {  // prediction, some ids out of range
      std::vector<int> ids(1 + rng() % 5);
      for (int& id : ids) id = int(rng() % 20) - 2;
      cache.prefetch(layer, ids);
      continue;
    }
    const bool prefill = op == 2;
    std::vector<int> ids(1 + rng() % (prefill ? 12 : 6));
    for (int& id : ids) id = int(rng() % 16);  // duplicates allowed
    std::vector<const uint8_t*> dev(ids.size());
    cache.acquire(layer, ids, prefill ? CacheFill::kPrefill : CacheFill::kDemand, dev);
    CUDA_OK(cudaStreamSynchronize(stream_));  // compute waited for the copies it needs
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(matches(dev[i], layer, ids[i])) << "step " << it;
    cache.kernels_enqueued();
    if (rng() % 3 == 0) cache.end_step();
    if (it % 50 == 49) {  // every resident expert holds its own bytes
      CUDA_OK(cudaDeviceSynchronize());
      for (int l = 0; l < 3; ++l)
        for (int e = 0; e < 16; ++e) {
          if (const uint8_t* p = cache.resident_payload(l, e)) {
            ASSERT_TRUE(matches(p, l, e));
          }
        }
    }
  }
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_GT(t.policy.evictions, 0u);
  EXPECT_GT(t.prefetch_issued, 0u);
  EXPECT_GT(t.prefetch_ignored, 0u);
  EXPECT_GT(t.policy.demand_hits, 0u);
  EXPECT_EQ(t.h2d_bytes % bytes_, 0u);
}

TEST_F(GpuExpertCacheTest, NothingIsCopiedWhenEveryExpertIsResident) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_);
  std::vector<int> ids{3, 9, 1};
  const std::vector<const uint8_t*> dev = use(cache, 1, ids);
  const GpuCacheTelemetry t1 = cache.telemetry();
  const uint64_t fetched = store_.stats().experts_requested;
  EXPECT_EQ(t1.h2d_bytes, 3 * bytes_);
  const std::vector<const uint8_t*> again = use(cache, 1, ids);
  const GpuCacheTelemetry t2 = cache.telemetry();
  EXPECT_EQ(t2.h2d_copies, t1.h2d_copies);
  EXPECT_EQ(t2.h2d_bytes, t1.h2d_bytes);
  EXPECT_EQ(store_.stats().experts_requested, fetched);  // nothing read either
  EXPECT_EQ(t2.policy.demand_hits, 3u);
  EXPECT_EQ(again, dev);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(matches(again[i], 1, ids[i]));
}

TEST_F(GpuExpertCacheTest, ContiguousMissesAreMergedIntoOneCopy) {
  SKIP_WITHOUT_GPU();
  GpuExpertCacheOptions o;
  o.chunk_bytes = 8 * bytes_;
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, o);
  std::vector<int> ids{5, 2, 7, 0};
  std::vector<const uint8_t*> dev(4);
  cache.acquire(0, ids, CacheFill::kDemand, dev);
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.h2d_copies, 1u);  // four fresh slots side by side in one chunk
  EXPECT_EQ(t.h2d_bytes, 4 * bytes_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(matches(dev[i], 0, ids[i]));
  cache.kernels_enqueued();
  // Two more misses next to each other and one apart: positions 4,5 then 6: still one range;
  // a hit in between changes nothing.
  std::vector<int> more{9, 5, 10, 11};
  std::vector<const uint8_t*> dev2(4);
  cache.acquire(0, more, CacheFill::kDemand, dev2);
  EXPECT_EQ(cache.telemetry().h2d_copies, 2u);
  EXPECT_EQ(cache.telemetry().h2d_bytes, 7 * bytes_);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < more.size(); ++i) EXPECT_TRUE(matches(dev2[i], 0, more[i]));
}

// two_phase: begin_acquire, the "kernels" of the ready experts, finish_acquire, the others'.
void kernels_still_queued(GpuExpertCacheTest& t, bool two_phase);

TEST_F(GpuExpertCacheTest, KernelsStillQueuedReadTheirExpertsWhileLaterCallsEvict) {
  kernels_still_queued(*this, false);
}

TEST_F(GpuExpertCacheTest, KernelsOnReadyExpertsBeforeFinishAcquireReadTheirExpertsUnderEvictions) {
  store_.trickle_ = 2;  // copies issued in several batches per call
  kernels_still_queued(*this, true);
}

void kernels_still_queued(GpuExpertCacheTest& t, bool two_phase) {
  SKIP_WITHOUT_GPU();
  auto& cfg_ = t.cfg_;
  auto& store_ = t.store_;
  auto& bytes_ = t.bytes_;
  auto& stream_ = t.stream_;
  // Each call's "kernel" is a device-to-device copy of its experts on the compute stream into a
  // check area, never waited for by the host until the end: a slot evicted, a scratch area or
  // a staging range reused before that copy ran would leave wrong bytes in the check area.
  GatedStore slow(cfg_);  // the worker's reads lag: demand waits for some, cancels others
  slow.open();
  slow.delay_us_ = 300;
  GpuExpertCacheOptions o;
  o.prefetch_store = &slow;
  o.chunk_bytes = 2 * bytes_;
  o.staging_bytes = 4 * bytes_;
  o.prefetch_staging_bytes = 2 * bytes_;
  GpuExpertCache cache(cfg_, store_, 6 * bytes_, stream_, o);
  constexpr int kCalls = 300, kMaxIds = 6;
  uint8_t* check = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&check), size_t(kCalls) * kMaxIds * bytes_));
  std::vector<std::vector<int>> called(kCalls);
  std::vector<int> layers(kCalls);
  std::mt19937 rng(11);
  for (int c = 0; c < kCalls; ++c) {  // decided in advance: predictions name the next call's ids
    layers[size_t(c)] = int(rng() % 3);
    called[size_t(c)].resize(1 + rng() % kMaxIds);
    for (int& id : called[size_t(c)]) id = int(rng() % 16);
  }
  for (int c = 0; c < kCalls; ++c) {
    const std::vector<int>& ids = called[size_t(c)];
    std::vector<const uint8_t*> dev(ids.size());
    const CacheFill kind = rng() % 4 ? CacheFill::kDemand : CacheFill::kPrefill;
    auto kernel = [&](size_t i) {
      return cudaMemcpyAsync(check + (size_t(c) * kMaxIds + i) * bytes_, dev[i], bytes_,
                             cudaMemcpyDeviceToDevice, stream_);
    };
    if (two_phase) {
      std::vector<uint8_t> ready(ids.size());
      cache.begin_acquire(layers[size_t(c)], ids, kind, dev, ready);
      for (size_t i = 0; i < ids.size(); ++i)
        if (ready[i]) {
          CUDA_OK(kernel(i));
        }
      cache.finish_acquire();
      for (size_t i = 0; i < ids.size(); ++i)
        if (!ready[i]) {
          CUDA_OK(kernel(i));
        }
    } else {
      cache.acquire(layers[size_t(c)], ids, kind, dev);
      for (size_t i = 0; i < ids.size(); ++i) CUDA_OK(kernel(i));
    }
    cache.kernels_enqueued();
    if (c + 1 < kCalls && rng() % 4) {  // one right (used or waited for), one likely wrong
      const std::vector<int>& next = called[size_t(c) + 1];
      std::vector<int> predicted{next[rng() % next.size()], int(rng() % 16)};
      cache.prefetch(layers[size_t(c) + 1], predicted);
    } else if (rng() % 2) {
      std::vector<int> predicted{int(rng() % 16), int(rng() % 16)};
      cache.prefetch(int(rng() % 3), predicted);
    }
    if (rng() % 3 == 0) cache.end_step();
  }
  CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<uint8_t> host(size_t(kCalls) * kMaxIds * bytes_);
  CUDA_OK(cudaMemcpy(host.data(), check, host.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(check));
  for (int c = 0; c < kCalls; ++c)
    for (size_t i = 0; i < called[size_t(c)].size(); ++i) {
      const auto& want = store_.payload(layers[size_t(c)], called[size_t(c)][i]);
      ASSERT_EQ(std::memcmp(host.data() + (size_t(c) * kMaxIds + i) * bytes_, want.data(), bytes_), 0)
          << "call " << c << " expert " << called[size_t(c)][i];
    }
  const GpuCacheTelemetry tel = cache.telemetry();
  EXPECT_GT(tel.policy.evictions, 0u);
  EXPECT_GT(tel.scratch_uses, 0u);  // prefill with a full budget at least
  EXPECT_GT(tel.prefetch_used + tel.prefetch_refills, 0u);  // from the worker, or taken back
  EXPECT_GT(tel.prefetch_cancelled, 0u);
}

TEST_F(GpuExpertCacheTest, EachMissIsCopiedAsSoonAsItsReadLands) {
  SKIP_WITHOUT_GPU();
  GpuExpertCacheOptions o;
  o.chunk_bytes = 8 * bytes_;
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, o);
  store_.trickle_ = 1;  // one expert lands per wait
  std::vector<uint64_t> copies_seen;  // experts copied when the cache waits for the next one
  store_.on_wait_ = [&] { copies_seen.push_back(cache.telemetry().h2d_bytes / bytes_); };
  std::vector<int> ids{5, 2, 7, 0};
  std::vector<const uint8_t*> dev(4);
  cache.acquire(0, ids, CacheFill::kDemand, dev);
  // Waits 1..4 hand out an expert each, the fifth says "all handed out".
  EXPECT_EQ(copies_seen, (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(cache.telemetry().h2d_copies, 4u);  // one per landing: nothing to merge with
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(matches(dev[i], 0, ids[i]));
  cache.kernels_enqueued();
  // Two landing together are one batch, and adjacent slots one copy.
  store_.trickle_ = 2;
  copies_seen.clear();
  std::vector<int> more{9, 10, 11, 12};
  cache.acquire(0, more, CacheFill::kDemand, dev);
  EXPECT_EQ(copies_seen, (std::vector<uint64_t>{4, 6, 8}));
  EXPECT_EQ(cache.telemetry().h2d_copies, 6u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < more.size(); ++i) EXPECT_TRUE(matches(dev[i], 0, more[i]));
  cache.kernels_enqueued();
}

TEST_F(GpuExpertCacheTest, BeginAcquireHandsOutHitsBeforeAnyMissIsRead) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_);
  const std::vector<const uint8_t*> dev = use(cache, 2, {1, 2});  // warm
  const uint64_t requested = store_.stats().experts_requested;

  std::vector<int> ids{1, 5, 2, 6, 5};
  std::vector<const uint8_t*> got(ids.size());
  std::vector<uint8_t> ready(ids.size(), 7);
  cache.begin_acquire(2, ids, CacheFill::kDemand, got, ready);
  EXPECT_EQ(ready, (std::vector<uint8_t>{1, 0, 1, 0, 0}));
  EXPECT_EQ(store_.stats().experts_requested, requested);  // nothing read yet
  EXPECT_EQ(got[0], dev[0]);
  EXPECT_EQ(got[2], dev[1]);
  EXPECT_EQ(got[1], got[4]);
  for (const uint8_t* p : got) EXPECT_NE(p, nullptr);  // misses have their slot already
  // The hits are usable by compute now: their bytes, read on the compute stream.
  std::vector<uint8_t> host(bytes_);
  for (size_t i : {size_t(0), size_t(2)}) {
    CUDA_OK(cudaMemcpyAsync(host.data(), got[i], bytes_, cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(host, store_.payload(2, ids[i]));
  }
  // Nothing else may run on the cache in between.
  EXPECT_THROW(cache.kernels_enqueued(), ConfigError);
  EXPECT_THROW(cache.acquire(2, ids, CacheFill::kDemand, got), ConfigError);
  EXPECT_THROW(cache.end_step(), ConfigError);
  cache.finish_acquire();
  EXPECT_EQ(store_.stats().experts_requested, requested + 2);
  EXPECT_THROW(cache.finish_acquire(), ConfigError);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_TRUE(matches(got[i], 2, ids[i]));
  cache.kernels_enqueued();
}

// Blocks `compute` until released, so the slots of enqueued "kernels" stay pinned. Opens when
// destroyed: declared after the cache, a failing test never leaves the cache's destructor
// waiting on a stream that cannot progress.
struct StreamGate {
  std::atomic<bool> open{false};
  ~StreamGate() { open = true; }
  static void CUDART_CB wait(void* p) {
    auto* g = static_cast<StreamGate*>(p);
    while (!g->open.load()) std::this_thread::yield();
  }
};

TEST_F(GpuExpertCacheTest, ExpertsGoToScratchWhenEverySlotIsPinned) {
  SKIP_WITHOUT_GPU();
#ifdef MOESTREAM_FAKE_CUDA
  GTEST_SKIP() << "the fake CUDA runtime cannot run a host function that blocks its stream";
#endif
  GpuExpertCache cache(cfg_, store_, 2 * bytes_, stream_);
  StreamGate gate;
  CUDA_OK(cudaLaunchHostFunc(stream_, &StreamGate::wait, &gate));
  std::vector<int> first{0, 1}, second{2, 3};
  std::vector<const uint8_t*> d2(2);
  const std::vector<const uint8_t*> d1 = use(cache, 0, first);  // kernels behind the gate: both slots pinned
  cache.acquire(0, second, CacheFill::kDemand, d2);
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.scratch_uses, 2u);
  EXPECT_EQ(t.policy.demand_no_room, 2u);
  EXPECT_EQ(cache.resident_payload(0, 2), nullptr);
  EXPECT_NE(cache.resident_payload(0, 0), nullptr);
  cache.kernels_enqueued();
  gate.open = true;
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(matches(d1[size_t(i)], 0, first[size_t(i)]));
    EXPECT_TRUE(matches(d2[size_t(i)], 0, second[size_t(i)]));
  }
  // With the kernels done the pins are gone: the next demand evicts instead of using scratch.
  std::vector<int> third{4};
  std::vector<const uint8_t*> d3(1);
  cache.acquire(0, third, CacheFill::kDemand, d3);
  EXPECT_EQ(cache.telemetry().scratch_uses, 2u);
  EXPECT_EQ(cache.telemetry().policy.evictions, 1u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(d3[0], 0, 4));
}

TEST_F(GpuExpertCacheTest, PrefillFillsFreeBudgetButNeverEvicts) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 3 * bytes_, stream_);
  use(cache, 0, {0, 1});  // decode
  const std::vector<int> prompt{2, 3, 4, 5};
  const std::vector<const uint8_t*> p = use(cache, 0, prompt, CacheFill::kPrefill);
  const GpuCacheTelemetry t = cache.telemetry();
  EXPECT_EQ(t.policy.prefill_fills, 1u);
  EXPECT_EQ(t.policy.prefill_no_room, 3u);
  EXPECT_EQ(t.policy.evictions, 0u);
  EXPECT_EQ(t.scratch_uses, 3u);
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_TRUE(matches(p[i], 0, prompt[i]));
  EXPECT_TRUE(matches(cache.resident_payload(0, 0), 0, 0));
  EXPECT_TRUE(matches(cache.resident_payload(0, 1), 0, 1));
}

TEST_F(GpuExpertCacheTest, AllocationFailureReleasesEverySlotAndRetriesOnce) {
  SKIP_WITHOUT_GPU();
  GpuExpertCacheOptions o;
  o.chunk_bytes = 2 * bytes_;  // each pair of new experts needs a new cudaMalloc
  GpuExpertCache cache(cfg_, store_, 8 * bytes_, stream_, o);
  use(cache, 0, {0, 1});  // the chunk made at construction
  cache.inject_alloc_failures(1);
  std::vector<const uint8_t*> d = use(cache, 0, {2, 3});
  std::vector<int> c{4, 5};
  EXPECT_EQ(cache.telemetry().alloc_retries, 1u);
  EXPECT_EQ(cache.resident_payload(0, 0), nullptr);  // released by the flush
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(d[0], 0, 2));
  EXPECT_TRUE(matches(d[1], 0, 3));

  cache.inject_alloc_failures(2);  // fails again after the flush: a clear error
  try {
    cache.acquire(0, c, CacheFill::kDemand, d);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free"), std::string::npos) << msg;
  }
  // The cache is usable afterwards.
  cache.acquire(0, c, CacheFill::kDemand, d);
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(matches(d[0], 0, 4));
  EXPECT_TRUE(matches(d[1], 0, 5));
}

// A GGUF's layers may hold experts of different sizes (mixed quantisations): one size class
// each, all drawing on one byte budget. Under a budget of a few experts, demand, prefill and
// predictions over the three layers evict across classes; every handed-out pointer holds its
// expert's bytes, aligned for the kernels, and the device never holds more slot memory than the
// budget.
TEST(GpuExpertCacheMixed, ExpertsOfSeveralSizesShareOneBudget) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = mixed_config();
  std::vector<size_t> sizes;
  for (int l = 0; l < cfg.n_layers; ++l) sizes.push_back(cfg.expert_layout(l).bytes);
  ASSERT_NE(sizes[0], sizes[1]);
  ASSERT_NE(sizes[1], sizes[2]);
  FakeStore store(cfg);
  GatedStore pf_store(cfg, true);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t max_bytes = cfg.max_expert_bytes();
  const size_t budget = 7 * max_bytes;
  {
    GpuExpertCacheOptions o;
    o.prefetch_store = &pf_store;
    o.chunk_bytes = 2 * max_bytes;  // several chunks per class
    o.staging_bytes = 5 * max_bytes;
    o.prefetch_staging_bytes = 3 * max_bytes;
    GpuExpertCache cache(cfg, store, budget, stream, o);
    for (int l = 0; l < cfg.n_layers; ++l) EXPECT_EQ(cache.expert_bytes(l), sizes[size_t(l)]);
    auto matches = [&](const uint8_t* dev, int layer, int e) -> ::testing::AssertionResult {
      if (!dev) return ::testing::AssertionFailure() << "null pointer for " << layer << "/" << e;
      if (reinterpret_cast<uintptr_t>(dev) % 16 != 0)
        return ::testing::AssertionFailure() << "layer " << layer << " expert " << e << " not 16-byte aligned";
      std::vector<uint8_t> host(sizes[size_t(layer)]);
      if (cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
        return ::testing::AssertionFailure() << "cudaMemcpy failed";
      if (host != store.payload(layer, e))
        return ::testing::AssertionFailure() << "device bytes differ for layer " << layer << " expert " << e
                                             << " (" << host.size() << " bytes)";
      return ::testing::AssertionSuccess();
    };
    std::mt19937 rng(11);
    for (int it = 0; it < 500; ++it) {
      const int layer = int(rng() % 3);
      const int op = int(rng() % 5);
      if (op == 4) {
        std::vector<int> ids(1 + rng() % 4);
        for (int& id : ids) id = int(rng() % 16);
        cache.prefetch(layer, ids);
        continue;
      }
      const bool prefill = op == 3;
      std::vector<int> ids(1 + rng() % 4);
      for (int& id : ids) id = int(rng() % 16);
      std::vector<const uint8_t*> dev(ids.size());
      cache.acquire(layer, ids, prefill ? CacheFill::kPrefill : CacheFill::kDemand, dev);
      CUDA_OK(cudaStreamSynchronize(stream));
      for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(matches(dev[i], layer, ids[i])) << "step " << it;
      cache.kernels_enqueued();
      if (rng() % 2 == 0) cache.end_step();
      if (it % 50 == 49) {
        CUDA_OK(cudaDeviceSynchronize());
        size_t resident = 0;
        for (int l = 0; l < 3; ++l)
          for (int e = 0; e < 16; ++e)
            if (const uint8_t* p = cache.resident_payload(l, e)) {
              ASSERT_TRUE(matches(p, l, e));
              resident += sizes[size_t(l)];
            }
        EXPECT_LE(resident, budget) << "residents of all classes exceed the one budget";
      }
    }
    const GpuCacheTelemetry t = cache.telemetry();
    EXPECT_GT(t.policy.evictions, 0u);
    EXPECT_GT(t.policy.demand_hits, 0u);
    EXPECT_GT(t.prefetch_issued, 0u);
  }
  cudaStreamDestroy(stream);
}

TEST(GpuExpertCacheMixed, BudgetBelowTheLargestExpertIsConfigError) {
  const ModelConfig cfg = mixed_config();
  FakeStore store(cfg);
  EXPECT_THROW(GpuExpertCache(cfg, store, cfg.max_expert_bytes() - 1, nullptr), ConfigError);
}

TEST_F(GpuExpertCacheTest, OutOfRangeDemandIsConfigError) {
  SKIP_WITHOUT_GPU();
  GpuExpertCache cache(cfg_, store_, 4 * bytes_, stream_);
  std::vector<int> ids{1, 16};
  std::vector<const uint8_t*> d(2);
  EXPECT_THROW(cache.acquire(0, ids, CacheFill::kDemand, d), ConfigError);
  std::vector<int> ok{1};
  std::vector<const uint8_t*> d1(1);
  EXPECT_THROW(cache.acquire(3, ok, CacheFill::kDemand, d1), ConfigError);
  EXPECT_THROW(cache.acquire(0, ok, CacheFill::kDemand, d), ConfigError);  // size mismatch
}

}  // namespace
}  // namespace moestream
