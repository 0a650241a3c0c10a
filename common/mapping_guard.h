// Faults in the project's file mappings turned into errors instead of a dead process: a SIGBUS
// on a registered mapping (the file was truncated, or the device failed the read) is survived
// and recorded, and the passes raise an IoError naming the file and offset before anything
// computed from the missing bytes leaves (docs/reliability.md, "Mapped files that fail").
//
// How: the first registration installs one process-wide SIGBUS handler (SA_SIGINFO). On a fault
// whose address lies in a registered mapping it maps anonymous zero pages (MAP_FIXED, PROT_READ)
// from the faulting page to the end of that mapping, so the faulting load and every later one
// read zeros (the kernel's shared zero page: no memory is spent), counts the fault and keeps its
// file offset in lock-free slots, and returns. A fault anywhere else goes to the handler that
// was installed before (Python's faulthandler, a sanitizer) or, with none, kills the process
// with SIGBUS as it would have died without this module.
//
// A faulted mapping stays poisoned (zeros) until its owner drops it: check_mapped_files() keeps
// throwing, so no later request computes from the zeros either. The same check compares each
// mapped file's inode, size and mtime with those it had when mapped, so a file rewritten or
// truncated in place under a running process is refused even where no page faulted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace moestream {

// One registered mapping, unregistered on destruction (before its owner unmaps it). Move-only.
class MappingGuard {
 public:
  MappingGuard() = default;
  // Registers [base, base + bytes) as the bytes of `path` from file offset 0, and keeps a
  // duplicate of `fd` to notice the file changing in place (unless !watch_changes: the read
  // engine's mmap backend, whose files may grow and whose reads the expert checksums cover).
  // IoError when the registry is full (kMaxMappings live mappings) or the handler cannot be
  // installed.
  MappingGuard(const void* base, uint64_t bytes, std::filesystem::path path, int fd, bool watch_changes = true);
  ~MappingGuard();
  MappingGuard(MappingGuard&& o) noexcept;
  MappingGuard& operator=(MappingGuard&& o) noexcept;
  MappingGuard(const MappingGuard&) = delete;
  MappingGuard& operator=(const MappingGuard&) = delete;

  bool registered() const { return slot_ >= 0; }
  // The MappingOwnerScope in force on the thread that registered it (0: none).
  uint64_t owner() const { return owner_; }
  // Faults taken in this mapping since it was registered (monotonic: compare before and after).
  uint64_t fault_count() const;
  // IoError naming the file and the first faulting offset when a page of this mapping faulted,
  // or the file's size or mtime (and with by_path, the inode its path names) when it changed
  // since it was mapped; nothing otherwise.
  void check(bool by_path = true) const;
  // The message check() throws, or "" when it would not throw.
  std::string problem(bool by_path = true) const;

  static constexpr int kMaxMappings = 4096;

 private:
  void release() noexcept;

  int slot_ = -1;
  uint64_t owner_ = 0;
  int fd_ = -1;
  bool watch_ = true;
  std::filesystem::path path_;
  uint64_t ino_ = 0, dev_ = 0, size_ = 0;
  int64_t mtime_ns_ = 0;
};

// Which mappings belong to whom: a Model (or a conversion) takes a fresh owner id and holds a
// MappingOwnerScope on its thread while it opens its files, so its check looks at its own files
// only: a file that changed under one loaded model does not fail another loaded after it.
uint64_t new_mapping_owner();
uint64_t current_mapping_owner();  // the innermost scope's owner on this thread; 0 when none
class MappingOwnerScope {
 public:
  explicit MappingOwnerScope(uint64_t owner);
  ~MappingOwnerScope();
  MappingOwnerScope(const MappingOwnerScope&) = delete;
  MappingOwnerScope& operator=(const MappingOwnerScope&) = delete;

 private:
  uint64_t previous_;
};

// check() of every live mapping of `owner`, and of every mapping registered outside any scope
// (nobody else would check those): IoError for the first that faulted or whose file changed.
// One fstat per such mapping (about 1 us each), and a stat of its path at most every 100 ms;
// Model calls it once per forward call, before logits return.
void check_mapped_files(uint64_t owner);

// Faults taken in registered mappings since the process started (tests; /metrics).
uint64_t mapped_fault_count();

}  // namespace moestream
