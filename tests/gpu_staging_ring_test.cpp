// Tests of runtime/gpu/gpu_staging_ring.h against the fake CUDA runtime, whose copies read their
// source only when they run (lazily, in a random interleaving): a staging range reused before the
// copy that read it completed shows up as wrong device bytes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/gpu/gpu_expert_cache.h"
#include "runtime/gpu/gpu_host_pin.h"
#include "runtime/gpu/gpu_staging_ring.h"
#include "tests/fake_cuda_runtime.h"
#include "tests/gpu_cache_test_stores.h"

namespace moestream {
namespace {

using namespace gpu_cache_test;

constexpr size_t kBytes = 1000;  // one expert

class GpuStagingRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_), 64 * kBytes), cudaSuccess);
    std::mt19937 rng(3);
    for (auto& p : payload_) {
      p.resize(kBytes);
      for (auto& b : p) b = uint8_t(rng());
    }
  }
  void TearDown() override {
    cudaStreamSynchronize(copy_);
    cudaFree(dev_);
    cudaStreamDestroy(copy_);
  }
  // Device bytes of position `pos` equal payload `p`.
  bool holds(size_t pos, const std::vector<uint8_t>& p) {
    std::vector<uint8_t> host(kBytes);
    cudaMemcpy(host.data(), dev_ + pos * kBytes, kBytes, cudaMemcpyDeviceToHost);
    return host == p;
  }
  GpuCopy to(size_t pos, const std::vector<uint8_t>& p, int slot = -1) {
    return GpuCopy{dev_ + pos * kBytes, p.data(), kBytes, slot, 0, dev_};
  }

  GpuEventPool events_;
  cudaStream_t copy_ = nullptr;
  uint8_t* dev_ = nullptr;
  std::vector<uint8_t> payload_[64];
};

TEST_F(GpuStagingRingTest, DeviceAdjacentExpertsGoAsOneCopy) {
  GpuStagingRing ring(8 * kBytes, copy_, events_, /*batch_copies=*/false);
  std::vector<GpuCopy> cs{to(3, payload_[3]), to(0, payload_[0]), to(1, payload_[1])};
  uint64_t copies = 0, bytes = 0;
  const uint64_t seq = ring.upload(cs, copies, bytes);
  EXPECT_EQ(seq, 1u);
  EXPECT_EQ(copies, 2u) << "positions 0-1 merge, 3 stands alone";
  EXPECT_EQ(bytes, 3 * kBytes);
  for (const GpuCopy& c : cs) EXPECT_EQ(c.seq, 1u);
  ASSERT_EQ(cudaStreamSynchronize(copy_), cudaSuccess);
  EXPECT_TRUE(holds(0, payload_[0]));
  EXPECT_TRUE(holds(1, payload_[1]));
  EXPECT_TRUE(holds(3, payload_[3]));
}

TEST_F(GpuStagingRingTest, GroupsFitHalfTheRingAndAreNumberedInOrder) {
  GpuStagingRing ring(4 * kBytes, copy_, events_, true);  // groups of 2 experts
  std::vector<GpuCopy> cs;
  for (size_t i = 0; i < 5; ++i) cs.push_back(to(2 * i, payload_[i]));  // none adjacent
  uint64_t copies = 0, bytes = 0;
  EXPECT_EQ(ring.upload(cs, copies, bytes), 3u);
  EXPECT_EQ(copies, 5u);
  EXPECT_EQ(cs[0].seq, 1u);
  EXPECT_EQ(cs[1].seq, 1u);
  EXPECT_EQ(cs[2].seq, 2u);
  EXPECT_EQ(cs[4].seq, 3u);
  EXPECT_EQ(ring.last_seq(), 3u);
  ring.wait(2);
  EXPECT_GE(ring.completed_seq(), 2u);
  ASSERT_EQ(cudaStreamSynchronize(copy_), cudaSuccess);
  ring.poll();
  EXPECT_EQ(ring.completed_seq(), 3u);
  EXPECT_EQ(ring.n_in_flight(), 0u);
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(holds(2 * i, payload_[i])) << i;
}

TEST_F(GpuStagingRingTest, StagingIsReusedOnlyAfterTheCopyThatReadItCompleted) {
  // A ring of 3 experts wraps every call or two while the fake device lags behind; the payload
  // buffers are overwritten once upload() returns (a store reuses its buffers too).
  GpuStagingRing ring(3 * kBytes, copy_, events_, true);
  std::mt19937 rng(11);
  std::vector<std::vector<uint8_t>> want(64);
  std::vector<uint8_t> src[3];
  uint64_t copies = 0, bytes = 0;
  for (int round = 0; round < 200; ++round) {
    const size_t n = 1 + rng() % 3;
    std::vector<GpuCopy> cs;
    for (size_t k = 0; k < n; ++k) {
      const size_t pos = rng() % 64;
      if (std::any_of(cs.begin(), cs.end(), [&](const GpuCopy& c) { return c.dst == dev_ + pos * kBytes; })) {
        continue;
      }
      src[k] = payload_[rng() % 64];
      want[pos] = src[k];
      cs.push_back(to(pos, src[k]));
    }
    ring.upload(cs, copies, bytes);
    for (auto& s : src) std::fill(s.begin(), s.end(), uint8_t(0x55));
    if (round % 7 == 0) ring.poll();
  }
  ASSERT_EQ(cudaStreamSynchronize(copy_), cudaSuccess);
  for (size_t pos = 0; pos < 64; ++pos) {
    if (!want[pos].empty()) {
      EXPECT_TRUE(holds(pos, want[pos])) << "position " << pos;
    }
  }
}

TEST_F(GpuStagingRingTest, EventOfABatchInFlightLetsAnotherStreamWaitForIt) {
  GpuStagingRing ring(4 * kBytes, copy_, events_, true);
  std::vector<GpuCopy> cs{to(5, payload_[5])};
  uint64_t copies = 0, bytes = 0;
  const uint64_t seq = ring.upload(cs, copies, bytes);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_GT(seq, ring.completed_seq()) << "nothing retires a batch before poll() or wait()";
  ASSERT_EQ(cudaStreamWaitEvent(other, ring.event_of(seq), 0), cudaSuccess);
  std::vector<uint8_t> back(kBytes);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), dev_ + 5 * kBytes, kBytes, cudaMemcpyDeviceToHost, other), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(back, payload_[5]) << "the read on `other` ran after the copy";
  cudaStreamDestroy(other);
  ring.retire_all();
  EXPECT_EQ(ring.completed_seq(), seq);
  EXPECT_EQ(ring.n_in_flight(), 0u);
}

// The experts of layer 1 the read tests ask for, in that order.
const std::vector<int> kFiveIds{9, 2, 14, 5, 7};

// Device memory for the read tests' expert slots, freed on scope exit (p is null when
// cudaMalloc failed).
struct DeviceSlots {
  explicit DeviceSlots(size_t bytes) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceSlots() { cudaFree(p); }
  DeviceSlots(const DeviceSlots&) = delete;
  DeviceSlots& operator=(const DeviceSlots&) = delete;
  uint8_t* p = nullptr;
};

// Copies of n experts of b bytes each into consecutive slots from `slots`, slot i for the i-th.
std::vector<GpuCopy> copies_into(uint8_t* slots, size_t b, size_t n) {
  std::vector<GpuCopy> cs;
  for (size_t i = 0; i < n; ++i) cs.push_back(GpuCopy{slots + i * b, nullptr, b, int(i), 0, slots});
  return cs;
}

TEST_F(GpuStagingRingTest, ReadAndUploadCopiesEachGroupAsSoonAsItLands) {
  const ModelConfig cfg = small_config();
  const size_t b = expert_bytes(cfg);
  FakeStore store(cfg);
  store.trickle_ = 2;  // each waiting next_ready() lands two experts
  const DeviceSlots slots(8 * b);
  ASSERT_NE(slots.p, nullptr) << "cudaMalloc";
  GpuStagingRing ring(8 * b, copy_, events_, true);
  const std::vector<int> ids = kFiveIds;
  std::vector<GpuCopy> cs = copies_into(slots.p, b, ids.size());
  GpuCacheTelemetry tel;
  std::vector<uint64_t> seq_of(ids.size(), 0);
  const GpuExpertParts parts = GpuExpertParts::of(cfg.expert_layout(1), 64, 96);
  const uint64_t last = ring.read_and_upload(store, 1, ids, cs, parts, nullptr, tel, [&](const GpuCopy& c) {
    seq_of[size_t(c.slot)] = c.seq;
  });
  EXPECT_EQ(last, 3u) << "2 + 2 + 1 experts landed: three uploads";
  EXPECT_EQ(tel.h2d_bytes, ids.size() * b);
  EXPECT_GE(tel.demand_wait_s, 0.0);
  // Experts are handed out last first: the last two asked landed first.
  EXPECT_EQ(seq_of, (std::vector<uint64_t>{3, 2, 2, 1, 1}));
  ASSERT_EQ(cudaStreamSynchronize(copy_), cudaSuccess);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<uint8_t> host(b);
    cudaMemcpy(host.data(), slots.p + i * b, b, cudaMemcpyDeviceToHost);
    EXPECT_EQ(host, store.payload(1, ids[i])) << "expert " << ids[i];
  }
}

// Reads experts 9, 2, 14, 5, 7 of layer 1 of `store` through a ring into five device slots and
// checks each slot's matrices against the store's payload; returns the telemetry.
GpuCacheTelemetry read_five(FakeStore& store, const ModelConfig& cfg, GpuEventPool& events,
                            cudaStream_t copy, const GpuPinnedMappings* pinned) {
  const size_t b = expert_bytes(cfg);
  const DeviceSlots slots(8 * b);
  EXPECT_NE(slots.p, nullptr) << "cudaMalloc";
  GpuStagingRing ring(8 * b, copy, events, true);
  const std::vector<int> ids = kFiveIds;
  std::vector<GpuCopy> cs = copies_into(slots.p, b, ids.size());
  GpuCacheTelemetry tel;
  const ExpertLayout lay = cfg.expert_layout(1);
  const GpuExpertParts parts = GpuExpertParts::of(lay, size_t(cfg.hidden_size), size_t(cfg.moe_intermediate_size));
  ring.read_and_upload(store, 1, ids, cs, parts, pinned, tel, [](const GpuCopy&) {});
  EXPECT_EQ(cudaStreamSynchronize(copy), cudaSuccess);
  const size_t from[] = {lay.gate_offset, lay.up_offset, lay.down_offset};
  const size_t len[] = {parts.gate_bytes, parts.up_bytes, parts.down_bytes};
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<uint8_t> host(b);
    cudaMemcpy(host.data(), slots.p + i * b, b, cudaMemcpyDeviceToHost);
    const std::vector<uint8_t>& want = store.payload(1, ids[i]);
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(std::memcmp(host.data() + from[k], want.data() + from[k], len[k]), 0)
          << "expert " << ids[i] << ", matrix " << k;
  }
  return tel;
}

TEST_F(GpuStagingRingTest, MatricesHandedOutApartLandAtTheirOffsetsInTheSlot) {
  const ModelConfig cfg = small_config();
  FakeStore store(cfg);
  store.split_matrices_ = true;  // a GGUF computed in place: three tensors
  store.trickle_ = 2;
  const GpuCacheTelemetry tel = read_five(store, cfg, events_, copy_, nullptr);
  EXPECT_EQ(tel.h2d_direct_bytes, 0u);
  const GpuExpertParts parts = GpuExpertParts::of(cfg.expert_layout(1), size_t(cfg.hidden_size),
                                                  size_t(cfg.moe_intermediate_size));
  EXPECT_EQ(tel.h2d_bytes, 5 * (parts.gate_bytes + parts.up_bytes + parts.down_bytes))
      << "the three matrices of each expert, not the payload's alignment gaps";
}

TEST_F(GpuStagingRingTest, PartsInPinnedMappingsAreCopiedFromThereAndTheRestStaged) {
  const ModelConfig cfg = small_config();
  FakeStore store(cfg);
  store.map_payloads_ = true;
  {
    GpuPinnedMappings pinned(store.mapped_regions());
    EXPECT_EQ(fake_cuda::registered_ranges(), size_t(cfg.n_layers * cfg.n_experts));
    const GpuCacheTelemetry direct = read_five(store, cfg, events_, copy_, &pinned);
    EXPECT_EQ(direct.h2d_direct_bytes, 5 * expert_bytes(cfg)) << "every payload lies in a pinned region";
    // Split parts are copies outside the regions: staged.
    store.split_matrices_ = true;
    const GpuCacheTelemetry staged = read_five(store, cfg, events_, copy_, &pinned);
    EXPECT_EQ(staged.h2d_direct_bytes, 0u);
  }
  EXPECT_EQ(fake_cuda::registered_ranges(), 0u) << "the mappings are unregistered with the object";
}

TEST(GpuPinnedMappings, NoMappedFileIsAConfigErrorNamingIoDirect) {
  try {
    GpuPinnedMappings none({});
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("`io_direct`"), std::string::npos) << e.what();
  }
}

TEST_F(GpuStagingRingTest, EntriesAreReusedOnlyAfterTheirCopyCompleted) {
  GpuStagingEntries entries(kBytes, 2);
  std::vector<uint8_t> src;
  for (size_t i = 0; i < 12; ++i) {
    uint8_t* st = entries.next();
    src = payload_[i];
    std::memcpy(st, src.data(), kBytes);
    ASSERT_EQ(cudaMemcpyAsync(dev_ + i * kBytes, st, kBytes, cudaMemcpyHostToDevice, copy_), cudaSuccess);
    entries.record(copy_);
  }
  ASSERT_EQ(cudaStreamSynchronize(copy_), cudaSuccess);
  for (size_t i = 0; i < 12; ++i) EXPECT_TRUE(holds(i, payload_[i])) << i;
}

}  // namespace
}  // namespace moestream
