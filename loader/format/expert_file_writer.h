// Writes an expert file (loader/format/expert_file.h layout) one expert at a time, so a converter or a
// repack never holds a whole layer in memory; temp file + fsync + rename on finish().
#pragma once

#include <cstdint>
#include <filesystem>

#include "loader/format/expert_file.h"

namespace moestream {

class ExpertFileWriter {
 public:
  // Creates `path.tmp.<pid>` sized for n_experts slots; throws IoError naming the path.
  ExpertFileWriter(std::filesystem::path path, QuantType quant, uint32_t layer, uint32_t n_experts,
                   uint32_t hidden, uint32_t intermediate);
  // A type per matrix. `min_stride`: a slot stride of at least this many bytes (rounded up to
  // 4096), for a pack whose layers have experts of several sizes: the engine reads every slot
  // with one buffer size, the largest. `hash`: the slot checksums' hash; XXH3 makes a version-2
  // file, XXH64 a version-1 file where one pack type covers all three matrices (what builds
  // before 2026-12-04 read).
  ExpertFileWriter(std::filesystem::path path, const ExpertTypes& types, uint32_t layer, uint32_t n_experts,
                   uint32_t hidden, uint32_t intermediate, uint64_t min_stride = 0,
                   PayloadHash hash = PayloadHash::kXxh3);
  ~ExpertFileWriter();  // removes the temp file unless finish() succeeded
  ExpertFileWriter(const ExpertFileWriter&) = delete;
  ExpertFileWriter& operator=(const ExpertFileWriter&) = delete;

  const ExpertLayout& layout() const { return layout_; }
  // Writes the expert_bytes payload of physical slot `slot` (each slot exactly once).
  void write_expert(uint32_t slot, const uint8_t* payload);
  // Writes the header with every slot's checksum, fsyncs, renames over `path`.
  void finish();

 private:
  std::filesystem::path path_, tmp_;
  ExpertFileHeader header_;
  ExpertLayout layout_;
  std::vector<bool> written_;
  int fd_ = -1;
  bool finished_ = false;
};

}  // namespace moestream
