// Which experts' page-cache copies have passed their checksum (issue 19 item 4; docs/io_engine.md
// "In place from the page cache"). Checksums verify what comes from the device. An expert read
// through the page cache and verified is marked; while its pages stay resident and its file is
// unchanged, later uses read those same pages, so the engine store computes it in place (CPU) or
// copies it (GPU staging) without hashing it again. A residency probe that finds its pages gone
// unmarks it (the next read comes from the device and is verified); a change of its file's size,
// inode, mtime or ctime (fstat on a descriptor held open) unmarks every expert of the file.
// Caller's thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <vector>

namespace moestream {

class VerifiedPages {
 public:
  VerifiedPages() = default;
  ~VerifiedPages();
  VerifiedPages(const VerifiedPages&) = delete;
  VerifiedPages& operator=(const VerifiedPages&) = delete;

  // Tracks a layer of n_slots experts stored in `path` (a pack layer: one file). Returns its
  // index (layers are added in order). IoError naming the file when it cannot be opened.
  int add_layer(const std::filesystem::path& path, uint32_t n_slots);

  // Unmarks every expert of `layer` when its file changed since the last call; then returns
  // whether marks may be trusted at all (false after a failed fstat: nothing is trusted).
  bool refresh(int layer);
  bool holds(int layer, uint32_t slot) const { return layers_[size_t(layer)].marks[slot] != 0; }
  void mark(int layer, uint32_t slot) { layers_[size_t(layer)].marks[slot] = 1; }
  void forget(int layer, uint32_t slot) { layers_[size_t(layer)].marks[slot] = 0; }
  uint64_t invalidations() const { return invalidations_; }  // files seen changed
  // Changes of `layer`'s file that refresh() saw: a hash taken at one epoch may mark its expert
  // only while the epoch is the same (a deferred check, pending_checks.h, marks a step later).
  uint64_t epoch(int layer) const { return layers_[size_t(layer)].epoch; }

 private:
  struct Stamp {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    bool operator==(const Stamp&) const = default;
  };
  struct Layer {
    int fd = -1;
    Stamp stamp;
    std::vector<uint8_t> marks;
    uint64_t epoch = 0;
  };
  static bool stat_fd(int fd, Stamp* out);
  std::vector<Layer> layers_;
  uint64_t invalidations_ = 0;
};

}  // namespace moestream
