// Tests of runtime/gpu/gpu_slot_arena.h against the fake CUDA runtime (tests/fake_cuda_runtime.h
// hooks: failed cudaMalloc, live device bytes): chunk sizing under the budget, lowest-free
// placement, deferred chunk frees, cudaMalloc failure as DeviceOom, release-and-retry once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/gpu/gpu_slot_arena.h"
#include "tests/fake_cuda_runtime.h"

namespace moestream {
namespace {

constexpr size_t kSmall = 1000, kLarge = 3000;  // slot bytes of classes 0 and 1

// The message of the Error `f` throws; "" (a test failure) when it throws none or a DeviceOom,
// which must never leave the arena's error paths.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DeviceOom&) {
    ADD_FAILURE() << "DeviceOom escaped";
    return "";
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

class GpuSlotArenaTest : public ::testing::Test {
 protected:
  void SetUp() override { base_ = fake_cuda::live_device_bytes(); }
  size_t live() const { return fake_cuda::live_device_bytes() - base_; }
  size_t base_ = 0;
};

TEST_F(GpuSlotArenaTest, FirstChunksSplitTheBudgetBetweenClassesUpToOneChunk) {
  {
    // Budget 20 small slots, chunk 8: each class gets min(8000, 10000) bytes of whole slots.
    GpuSlotArena arena(20 * kSmall, 8 * kSmall, {kSmall, kLarge});
    arena.reserve_first_chunks();
    EXPECT_EQ(arena.n_live_chunks(0), 1);
    EXPECT_EQ(arena.n_live_chunks(1), 1);
    EXPECT_EQ(arena.reserved_bytes(), 8 * kSmall + 2 * kLarge);
    EXPECT_EQ(live(), arena.reserved_bytes());
  }
  EXPECT_EQ(live(), 0u) << "the destructor frees every chunk";
}

TEST_F(GpuSlotArenaTest, SlotsTakeTheLowestFreePositionSoFillsMadeTogetherAreAdjacent) {
  GpuSlotArena arena(12 * kSmall, 4 * kSmall, {kSmall});
  arena.reserve_first_chunks();
  uint8_t* a = arena.assign(0, 0);
  EXPECT_EQ(arena.assign(1, 0), a + kSmall);
  EXPECT_EQ(arena.assign(2, 0), a + 2 * kSmall);
  EXPECT_EQ(arena.slot_ptr(1), a + kSmall);
  arena.release(1, 0);
  EXPECT_EQ(arena.slot_ptr(1), nullptr);
  EXPECT_EQ(arena.assign(7, 0), a + kSmall) << "the freed position is reused first";
  EXPECT_EQ(arena.n_live_chunks(0), 1);
}

TEST_F(GpuSlotArenaTest, NewChunksAreSizedByTheBudgetLeft) {
  // Budget 7 slots, chunks of 3: 3 + 3, then only 1 slot of budget is left.
  GpuSlotArena arena(7 * kSmall, 3 * kSmall, {kSmall});
  arena.reserve_first_chunks();
  for (int s = 0; s < 7; ++s) ASSERT_NE(arena.assign(s, 0), nullptr);
  EXPECT_EQ(arena.n_live_chunks(0), 3);
  EXPECT_EQ(arena.reserved_bytes(), 7 * kSmall);
  // Past the budget (the policy never asks, but a chunk is never empty): one slot at a time.
  arena.assign(7, 0);
  EXPECT_EQ(arena.reserved_bytes(), 8 * kSmall);
  EXPECT_EQ(live(), 8 * kSmall);
}

TEST_F(GpuSlotArenaTest, AnEmptiedChunkIsFreedOnlyOnceTheLastCopyIntoItCompleted) {
  GpuSlotArena arena(4 * kSmall, 2 * kSmall, {kSmall, kLarge});
  arena.reserve_first_chunks();  // class 0: 2 slots, class 1: 1 slot
  arena.assign(0, 0);
  arena.assign(1, 0);
  arena.assign(2, 1);
  const size_t before = live();
  arena.release(0, 5);
  EXPECT_EQ(arena.n_deferred_frees(), 0u) << "the chunk still holds slot 1";
  arena.release(1, 5);  // copy batch 5 may still write it
  EXPECT_EQ(arena.n_live_chunks(0), 0);
  EXPECT_EQ(arena.reserved_bytes(), kLarge);
  EXPECT_EQ(arena.n_deferred_frees(), 1u);
  arena.free_completed(4);
  EXPECT_EQ(live(), before) << "batch 5 has not completed";
  arena.free_completed(5);
  EXPECT_EQ(arena.n_deferred_frees(), 0u);
  EXPECT_EQ(live(), before - 2 * kSmall);
  // The class's next slot gets a new chunk in the freed entry.
  EXPECT_NE(arena.assign(3, 0), nullptr);
  EXPECT_EQ(arena.n_live_chunks(0), 1);
}

TEST_F(GpuSlotArenaTest, FailedCudaMallocIsDeviceOomAndChangesNothing) {
  GpuSlotArena arena(6 * kSmall, 2 * kSmall, {kSmall});
  arena.reserve_first_chunks();
  arena.assign(0, 0);
  arena.assign(1, 0);
  fake_cuda::fail_next_mallocs(1);
  try {
    arena.assign(2, 0);
    FAIL() << "no DeviceOom";
  } catch (const DeviceOom& oom) {
    EXPECT_EQ(oom.bytes, 2 * kSmall);
  }
  EXPECT_EQ(arena.reserved_bytes(), 2 * kSmall);
  EXPECT_EQ(arena.slot_ptr(2), nullptr);
  EXPECT_NE(arena.assign(2, 0), nullptr) << "the next allocation succeeds";
}

TEST_F(GpuSlotArenaTest, InjectedFailuresCountDown) {
  GpuSlotArena arena(6 * kSmall, 2 * kSmall, {kSmall});
  arena.inject_failures(2);
  EXPECT_THROW(arena.scratch(kSmall), DeviceOom);
  EXPECT_THROW(arena.scratch(kSmall), DeviceOom);
  EXPECT_NE(arena.scratch(kSmall), nullptr);
}

TEST_F(GpuSlotArenaTest, NoDeviceMemoryForTheFirstChunksIsAClearErrorAndLeaksNothing) {
  GpuSlotArena arena(8 * kSmall, 4 * kSmall, {kSmall, kLarge});
  fake_cuda::fail_next_mallocs(1, /*skip=*/1);  // class 0's chunk is allocated, class 1's fails
  // There is no cached expert to release yet: an Error at once.
  const std::string what = error_of([&] { arena.reserve_first_chunks(); });
  EXPECT_NE(what.find("cannot allocate the first 0 MiB"), std::string::npos) << what;
  EXPECT_NE(what.find("budget 0 MiB, device has"), std::string::npos) << what;
  EXPECT_EQ(arena.reserved_bytes(), 0u);
  EXPECT_EQ(arena.n_live_chunks(0), 0);
  EXPECT_EQ(live(), 0u) << "class 0's chunk is released again";
}

TEST_F(GpuSlotArenaTest, VramRetryReleasesEverythingAndRetriesOnce) {
  GpuSlotArena arena(6 * kSmall, 2 * kSmall, {kSmall});
  arena.reserve_first_chunks();
  int ops = 0, releases = 0;
  uint64_t retries = 0;
  auto release = [&] {
    ++releases;
    arena.release_all();
  };
  // Each op allocates: a scratch area larger than any before.
  size_t scratch = 0;
  auto op = [&] {
    ++ops;
    scratch += kSmall;
    arena.scratch(scratch);
  };
  arena.assign(0, 0);
  arena.inject_failures(1);
  arena.with_vram_retry(op, release, retries);
  EXPECT_EQ(ops, 2);
  EXPECT_EQ(releases, 1);
  EXPECT_EQ(retries, 1u);
  EXPECT_EQ(arena.slot_ptr(0), nullptr) << "the release freed every slot";
  EXPECT_EQ(arena.scratch_bytes(), scratch);

  ops = releases = 0;
  arena.inject_failures(2);  // fails again after the release: a clear error, released again
  const std::string what = error_of([&] { arena.with_vram_retry(op, release, retries); });
  EXPECT_NE(what.find("even after releasing every cached expert"), std::string::npos) << what;
  EXPECT_NE(what.find("lower `gpu_cache_mb`"), std::string::npos) << what;
  EXPECT_EQ(ops, 2);
  EXPECT_EQ(releases, 2);
  EXPECT_EQ(retries, 2u);
  EXPECT_EQ(live(), 0u);

  ops = releases = 0;  // no failure: no release
  arena.with_vram_retry([&] { ++ops; }, release, retries);
  EXPECT_EQ(ops, 1);
  EXPECT_EQ(releases, 0);
}

TEST_F(GpuSlotArenaTest, ScratchIsReplacedOnlyWhenTooSmall) {
  GpuSlotArena arena(4 * kSmall, 2 * kSmall, {kSmall});
  uint8_t* s = arena.scratch(2 * kSmall);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(arena.scratch(kSmall), s);
  EXPECT_EQ(arena.scratch_bytes(), 2 * kSmall);
  arena.scratch(3 * kSmall);
  EXPECT_EQ(arena.scratch_bytes(), 3 * kSmall);
  EXPECT_EQ(live(), 3 * kSmall) << "the old area is freed";
  fake_cuda::fail_next_mallocs(1);
  EXPECT_THROW(arena.scratch(5 * kSmall), DeviceOom);
  EXPECT_EQ(arena.scratch_bytes(), 0u) << "the old area is gone, none replaces it";
  EXPECT_EQ(live(), 0u);
}

}  // namespace
}  // namespace moestream
