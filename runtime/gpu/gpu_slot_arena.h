// Device memory of the GPU expert cache: for each expert size class, slots carved from chunks
// (64 MiB by default) under one byte budget, plus the scratch area for experts that got no slot.
// A failed cudaMalloc becomes DeviceOom, which with_vram_retry() answers by releasing everything
// (the caller's flush) and retrying once. Internal to runtime/gpu (needs the CUDA runtime).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moestream {

// A device allocation that failed for lack of memory (recoverable: release and retry).
struct DeviceOom {
  size_t bytes;
};

class GpuSlotArena {
 public:
  // class_slot_bytes[c]: bytes of one slot of size class c (LfruPolicy::class_slot_bytes).
  GpuSlotArena(size_t budget_bytes, size_t chunk_bytes, std::vector<size_t> class_slot_bytes);
  ~GpuSlotArena();  // frees all device memory: the caller has synchronized its streams
  GpuSlotArena(const GpuSlotArena&) = delete;
  GpuSlotArena& operator=(const GpuSlotArena&) = delete;

  // Every class gets its first chunk now (min(chunk, budget / classes) of slots, at least one),
  // so a first prediction finds memory as readily as a first demand. Error when the device has
  // not even that (everything allocated so far is released first).
  void reserve_first_chunks();
  // Memory for slot `slot` of class `cls`, which the policy just created: the lowest free
  // position of the class's chunks (fills made together sit side by side and copy as one
  // range), else a new chunk of min(chunk, budget left) bytes. DeviceOom when cudaMalloc fails.
  uint8_t* assign(int slot, int cls);
  // The policy gave `slot` up: its position is free; a chunk left with none in use is freed
  // once copy batch `last_seq` (the last one issued, which may still write it) has completed.
  void release(int slot, uint64_t last_seq);
  // Frees the chunks released before copy batch `completed_seq` completed.
  void free_completed(uint64_t completed_seq);
  // Device pointer of an assigned slot; nullptr when the slot has no memory.
  uint8_t* slot_ptr(int slot) const;
  // Start of the chunk (device allocation) holding `slot`, nullptr for an unknown slot.
  const uint8_t* slot_region(int slot) const;

  // The scratch area: at least `bytes`, reallocated when larger (the caller has made sure no
  // copy or kernel uses the old one). DeviceOom when cudaMalloc fails (the old one is gone).
  uint8_t* scratch(size_t bytes);
  size_t scratch_bytes() const { return scratch_bytes_; }

  // Frees every chunk and the scratch area at once (flush; the streams are synchronized).
  void release_all();

  size_t budget_bytes() const { return budget_; }
  size_t reserved_bytes() const { return reserved_bytes_; }  // bytes of live chunks
  int n_live_chunks(int cls) const;
  size_t n_deferred_frees() const { return free_later_.size(); }

  // The next `n` allocations fail as if cudaMalloc returned cudaErrorMemoryAllocation.
  void inject_failures(int n) { inject_failures_ = n; }
  // "budget N MiB, device has F MiB free of T MiB", for error messages.
  std::string memory_report() const;

  // Runs `op` (which must change no state before its allocations are done, or only state that
  // `release` resets); on DeviceOom runs `release` (which must free every slot: it calls
  // release_all()), counts a retry and runs `op` again; a second DeviceOom releases again and
  // throws Error naming the size, the budget and the device's free memory.
  template <class Op, class Release>
  void with_vram_retry(Op&& op, Release&& release, uint64_t& retries) {
    try {
      op();
      return;
    } catch (const DeviceOom&) {
    }
    release();
    ++retries;
    try {
      op();
    } catch (const DeviceOom& oom) {
      release();
      throw_exhausted(oom.bytes);
    }
  }

 private:
  struct Chunk {
    uint8_t* dev = nullptr;     // nullptr: entry unused (freed), reusable
    std::vector<uint8_t> used;  // by position
    int n_used = 0;
  };
  struct SlotMem {  // by policy slot index
    int cls = -1, chunk = -1, pos = -1;
    uint8_t* dev = nullptr;
  };

  uint8_t* device_alloc(size_t bytes);
  int add_chunk(int cls, int n_slots);
  [[noreturn]] void throw_exhausted(size_t bytes) const;

  size_t budget_, chunk_bytes_;
  std::vector<size_t> class_bytes_;
  std::vector<std::vector<Chunk>> pools_;  // by class
  std::vector<SlotMem> slots_;
  size_t reserved_bytes_ = 0;
  std::vector<std::pair<uint64_t, uint8_t*>> free_later_;  // chunk freed once batch seq is done
  uint8_t* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  int inject_failures_ = 0;
};

}  // namespace moestream
