// Implementation of runtime/gpu/gpu_slot_arena.h.
#include "runtime/gpu/gpu_slot_arena.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/option_ref.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_cache_common.h"

namespace moestream {

GpuSlotArena::GpuSlotArena(size_t budget_bytes, size_t chunk_bytes,
                           std::vector<size_t> class_slot_bytes)
    : budget_(budget_bytes), chunk_bytes_(chunk_bytes), class_bytes_(std::move(class_slot_bytes)) {
  MOE_ASSERT(chunk_bytes_ > 0 && !class_bytes_.empty(), "slot arena without chunks or classes");
  pools_.resize(class_bytes_.size());
}

GpuSlotArena::~GpuSlotArena() {
  release_all();
  cudaGetLastError();
}

uint8_t* GpuSlotArena::device_alloc(size_t bytes) {
  if (inject_failures_ > 0) {
    --inject_failures_;
    throw DeviceOom{bytes};
  }
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls do not report it
    throw DeviceOom{bytes};
  }
  MOE_CUDA_CHECK(e);
  return static_cast<uint8_t*>(p);
}

int GpuSlotArena::add_chunk(int cls, int n_slots) {
  const size_t b = class_bytes_[size_t(cls)];
  uint8_t* dev = device_alloc(size_t(n_slots) * b);
  std::vector<Chunk>& pool = pools_[size_t(cls)];
  auto it = std::find_if(pool.begin(), pool.end(), [](const Chunk& c) { return !c.dev; });
  if (it == pool.end()) it = pool.insert(pool.end(), Chunk{});
  it->dev = dev;
  it->used.assign(size_t(n_slots), 0);
  it->n_used = 0;
  reserved_bytes_ += size_t(n_slots) * b;
  return int(it - pool.begin());
}

void GpuSlotArena::reserve_first_chunks() {
  const size_t share = budget_ / pools_.size();
  for (int cls = 0; cls < int(pools_.size()); ++cls) {
    const size_t b = class_bytes_[size_t(cls)];
    const int n = int(std::clamp<size_t>(std::min(chunk_bytes_, share) / b, 1,
                                          std::max<size_t>(budget_ / b, 1)));
    try {
      add_chunk(cls, n);
    } catch (const DeviceOom& oom) {
      release_all();
      throw Error("gpu cache: cannot allocate the first " + gpu_cache_mib(oom.bytes) +
                  " of device memory for expert slots (" + memory_report() + ")");
    }
  }
}

uint8_t* GpuSlotArena::assign(int slot, int cls) {
  std::vector<Chunk>& pool = pools_[size_t(cls)];
  const size_t b = class_bytes_[size_t(cls)];
  int ci = -1, pos = -1;
  for (size_t c = 0; c < pool.size() && ci < 0; ++c) {
    if (!pool[c].dev || pool[c].n_used == int(pool[c].used.size())) continue;
    ci = int(c);
    pos = int(std::find(pool[c].used.begin(), pool[c].used.end(), 0) - pool[c].used.begin());
  }
  if (ci < 0) {
    const size_t room = budget_ > reserved_bytes_ ? budget_ - reserved_bytes_ : 0;
    const size_t n = std::clamp<size_t>(std::min(chunk_bytes_, room) / b, 1,
                                        std::max<size_t>(budget_ / b, 1));
    ci = add_chunk(cls, int(n));
    pos = 0;
  }
  Chunk& c = pool[size_t(ci)];
  c.used[size_t(pos)] = 1;
  ++c.n_used;
  if (slots_.size() <= size_t(slot)) slots_.resize(size_t(slot) + 1);
  slots_[size_t(slot)] = SlotMem{cls, ci, pos, c.dev + size_t(pos) * b};
  return slots_[size_t(slot)].dev;
}

void GpuSlotArena::release(int slot, uint64_t last_seq) {
  SlotMem& m = slots_.at(size_t(slot));
  MOE_ASSERT(m.dev, "released slot has no memory");
  Chunk& c = pools_[size_t(m.cls)][size_t(m.chunk)];
  c.used[size_t(m.pos)] = 0;
  if (--c.n_used == 0) {
    free_later_.emplace_back(last_seq, c.dev);
    reserved_bytes_ -= c.used.size() * class_bytes_[size_t(m.cls)];
    c.dev = nullptr;
    c.used.clear();
  }
  m = SlotMem{};
}

void GpuSlotArena::free_completed(uint64_t completed_seq) {
  std::erase_if(free_later_, [&](const std::pair<uint64_t, uint8_t*>& f) {
    if (f.first > completed_seq) return false;
    cudaFree(f.second);
    return true;
  });
}

uint8_t* GpuSlotArena::slot_ptr(int slot) const {
  return size_t(slot) < slots_.size() ? slots_[size_t(slot)].dev : nullptr;
}

const uint8_t* GpuSlotArena::slot_region(int slot) const {
  if (size_t(slot) >= slots_.size()) return nullptr;
  const SlotMem& m = slots_[size_t(slot)];
  if (m.cls < 0 || m.chunk < 0) return nullptr;
  return pools_[size_t(m.cls)][size_t(m.chunk)].dev;
}

uint8_t* GpuSlotArena::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (scratch_) {
    MOE_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  scratch_ = device_alloc(bytes);
  scratch_bytes_ = bytes;
  return scratch_;
}

void GpuSlotArena::release_all() {
  for (auto& pool : pools_)
    for (Chunk& c : pool)
      if (c.dev) cudaFree(c.dev);
  pools_.assign(pools_.size(), {});
  for (auto& f : free_later_) cudaFree(f.second);
  free_later_.clear();
  if (scratch_) cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  slots_.clear();
  reserved_bytes_ = 0;
}

int GpuSlotArena::n_live_chunks(int cls) const {
  const std::vector<Chunk>& pool = pools_.at(size_t(cls));
  return int(std::count_if(pool.begin(), pool.end(), [](const Chunk& c) { return c.dev != nullptr; }));
}

std::string GpuSlotArena::memory_report() const {
  size_t free_b = 0, total_b = 0;
  std::string s = "budget " + gpu_cache_mib(budget_);
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    s += ", device has " + gpu_cache_mib(free_b) + " free of " + gpu_cache_mib(total_b);
  else
    cudaGetLastError();
  return s;
}

void GpuSlotArena::throw_exhausted(size_t bytes) const {
  throw Error("gpu cache: cannot allocate " + gpu_cache_mib(bytes) + " (" + std::to_string(bytes) +
              " bytes) of device memory for experts, even after releasing every cached expert (" +
              memory_report() + "); lower " + option_ref("gpu_cache_mb"));
}

}  // namespace moestream
