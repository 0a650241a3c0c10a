// Tests of runtime/gpu/gpu_prefetch_worker.h against the fake CUDA runtime: each job's bytes land
// in its slot and the slot is released only after its copy completed; cancelled and stolen jobs
// are never copied; a read error fails its group and is reported once; teardown cancels the
// queue and finishes the read in hand.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "runtime/gpu/gpu_prefetch_worker.h"
#include "tests/gpu_cache_test_stores.h"

namespace moestream {
namespace {

using namespace gpu_cache_test;
using JobPtr = GpuPrefetchWorker::JobPtr;
using JobState = GpuPrefetchWorker::JobState;

class GpuPrefetchWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_), 16 * bytes_), cudaSuccess);
  }
  void TearDown() override {
    worker_.reset();
    cudaFree(dev_);
  }
  // A worker whose release callback checks that the slot's bytes are in place (or that the job
  // was cancelled) and records the slot.
  void start(size_t staging_bytes = 0) {
    worker_ = std::make_unique<GpuPrefetchWorker>(store_, bytes_, staging_bytes, events_,
                                                  [this](GpuPrefetchWorker::Job& j) {
                                                    if (j.state == JobState::kIssued) {
                                                      EXPECT_TRUE(holds(j.slot, j.layer, j.expert))
                                                          << "released before its copy completed";
                                                    }
                                                    released_.push_back(j.slot);
                                                  });
  }
  // A group of (expert, slot) of `layer`; slot s is at dev_ + s * bytes_.
  std::vector<JobPtr> group(int layer, std::vector<std::pair<int, int>> experts) {
    std::vector<JobPtr> g;
    for (auto [e, s] : experts) g.push_back(worker_->make_job(layer, e, s, dev_ + size_t(s) * bytes_, bytes_));
    return g;
  }
  bool holds(int slot, int layer, int e) {
    std::vector<uint8_t> host(bytes_);
    cudaMemcpy(host.data(), dev_ + size_t(slot) * bytes_, bytes_, cudaMemcpyDeviceToHost);
    return host == store_.payload(layer, e);
  }
  bool untouched(int slot) {
    std::vector<uint8_t> host(bytes_);
    cudaMemcpy(host.data(), dev_ + size_t(slot) * bytes_, bytes_, cudaMemcpyDeviceToHost);
    return std::all_of(host.begin(), host.end(), [](uint8_t b) { return b == 0xEE; });
  }
  JobState wait(const JobPtr& j) {
    uint64_t waits = 0;
    double wait_s = 0;
    return worker_->wait_issued(*j, waits, wait_s);
  }

  ModelConfig cfg_ = small_config();
  size_t bytes_ = expert_bytes(cfg_);
  GatedStore store_{cfg_};
  GpuEventPool events_;
  uint8_t* dev_ = nullptr;
  std::vector<int> released_;
  std::unique_ptr<GpuPrefetchWorker> worker_;
};

TEST_F(GpuPrefetchWorkerTest, EachJobIsCopiedAndReleasedOnlyAfterItsCopyCompleted) {
  store_.open();
  start(2 * bytes_);  // two staging entries for five experts: entries are reused
  std::vector<JobPtr> g = group(2, {{3, 0}, {7, 1}, {1, 2}, {12, 3}, {5, 4}});
  worker_->submit(g);
  EXPECT_EQ(worker_->n_jobs(), 5u);
  for (const JobPtr& j : g) EXPECT_EQ(wait(j), JobState::kIssued);
  for (int i = 0; i < 20 && worker_->n_jobs() > 0; ++i) worker_->poll();  // some may be done
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const JobPtr& j : g) EXPECT_TRUE(worker_->copied(*j));
  worker_->poll();
  EXPECT_EQ(worker_->n_jobs(), 0u);
  std::sort(released_.begin(), released_.end());
  EXPECT_EQ(released_, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(events_.n_spare(), 5u) << "every job's event is back in the pool";
  EXPECT_EQ(worker_->counters().h2d_bytes, 5 * bytes_);
  EXPECT_EQ(worker_->counters().h2d_copies, 5u);
  worker_->reset_counters();
  EXPECT_EQ(worker_->counters().h2d_bytes, 0u);
}

TEST_F(GpuPrefetchWorkerTest, CancelledJobsAreNeverCopied) {
  start();
  std::vector<JobPtr> a = group(0, {{0, 0}});
  worker_->submit(a);
  store_.wait_entered(1);  // the worker is reading group a (kReading)
  std::vector<JobPtr> b = group(1, {{2, 1}, {3, 2}});
  worker_->submit(b);      // queued
  int cancelled = 0;
  worker_->cancel_unasked(1, {2}, [&](GpuPrefetchWorker::Job& j) {
    EXPECT_EQ(j.expert, 3);
    ++cancelled;
  });
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(released_, (std::vector<int>{2}));
  worker_->cancel_unasked(0, {}, [&](GpuPrefetchWorker::Job&) { ++cancelled; });  // a is kReading
  EXPECT_EQ(cancelled, 2);
  EXPECT_EQ(worker_->n_jobs(), 1u);
  store_.open();
  EXPECT_EQ(wait(b[0]), JobState::kIssued);
  worker_->drain();
  EXPECT_EQ(worker_->n_jobs(), 0u);
  EXPECT_TRUE(holds(1, 1, 2));
  EXPECT_TRUE(untouched(0)) << "cancelled while its group was read";
  EXPECT_TRUE(untouched(2)) << "cancelled while queued";
}

TEST_F(GpuPrefetchWorkerTest, StealTakesBackOnlyAJobTheWorkerHasNotBegunReading) {
  start();
  std::vector<JobPtr> a = group(0, {{4, 0}});
  worker_->submit(a);
  store_.wait_entered(1);
  std::vector<JobPtr> b = group(0, {{5, 1}});
  worker_->submit(b);
  EXPECT_FALSE(worker_->steal(*a[0])) << "its read has begun: the caller must wait for it";
  EXPECT_TRUE(worker_->steal(*b[0]));
  EXPECT_EQ(released_, (std::vector<int>{1}));
  EXPECT_EQ(worker_->n_jobs(), 1u);
  store_.open();
  EXPECT_EQ(wait(a[0]), JobState::kIssued);
  worker_->drain();
  EXPECT_TRUE(holds(0, 0, 4));
  EXPECT_TRUE(untouched(1));
  EXPECT_EQ(store_.layers_fetched().size(), 1u) << "the stolen job's group was never read";
}

TEST_F(GpuPrefetchWorkerTest, AReadErrorFailsItsGroupAndIsReportedOnce) {
  store_.fail_layer_ = 1;
  store_.open();
  start();
  std::vector<JobPtr> bad = group(1, {{6, 0}, {8, 1}});
  worker_->submit(bad);
  EXPECT_EQ(wait(bad[0]), JobState::kFailed);
  EXPECT_EQ(wait(bad[1]), JobState::kFailed);
  std::exception_ptr e = worker_->take_error();
  ASSERT_TRUE(e);
  EXPECT_THROW(std::rethrow_exception(e), IoError);
  EXPECT_FALSE(worker_->take_error()) << "reported once";
  std::vector<JobPtr> good = group(2, {{9, 2}});  // the worker goes on
  worker_->submit(good);
  EXPECT_EQ(wait(good[0]), JobState::kIssued);
  worker_->drain();
  EXPECT_TRUE(holds(2, 2, 9));
  EXPECT_TRUE(untouched(0));
}

TEST_F(GpuPrefetchWorkerTest, TeardownCancelsTheQueueAndFinishesTheReadInHand) {
  start();
  worker_->submit(group(0, {{1, 0}}));
  store_.wait_entered(1);
  worker_->submit(group(1, {{2, 1}}));
  // The read in hand lands once teardown has begun (it begins at once; 200 ms leaves room for
  // a loaded machine): the worker must then stop instead of reading the queued group.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    store_.open();
  });
  worker_.reset();  // blocks until the read in hand returns
  opener.join();
  EXPECT_EQ(store_.layers_fetched(), (std::vector<int>{0})) << "the queued group was never read";
  EXPECT_TRUE(released_.empty()) << "teardown releases nothing: the cache goes with it";
}

}  // namespace
}  // namespace moestream
