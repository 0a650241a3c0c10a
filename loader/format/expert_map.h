// The per-layer expert map `experts/layer_NNN.map`: which physical slot of layer_NNN.bin holds
// each logical expert, written by the clustering tools; identity when the file is absent.
//
// File layout (all integers little-endian), exactly 24 + 4*n bytes:
//   offset   size  field
//   0        8     magic "MOEXMAP\0"
//   8        4     version (kExpertMapVersion = 1)
//   12       4     n: number of experts (must equal the layer's n_experts)
//   16       4*n   uint32 physical slot of logical expert i, for i = 0..n-1; a permutation of
//                  0..n-1 (every slot exactly once)
//   16+4n    8     checksum: XXH64 (seed 0) of bytes [0, 16+4n)
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace moestream {

inline constexpr char kExpertMapMagic[8] = {'M', 'O', 'E', 'X', 'M', 'A', 'P', '\0'};
inline constexpr uint32_t kExpertMapVersion = 1;

class ExpertMap {
 public:
  ExpertMap() = default;
  static ExpertMap identity(uint32_t n);
  // `physical[i]` = slot of logical expert i; throws FormatError (naming `what`) unless it is a
  // permutation of 0..n-1.
  static ExpertMap from_slots(std::vector<uint32_t> physical, std::string_view what = "map");

  uint32_t size() const { return static_cast<uint32_t>(physical_.size()); }
  uint32_t physical(uint32_t logical) const { return physical_.at(logical); }
  uint32_t logical(uint32_t physical) const { return logical_.at(physical); }
  bool is_identity() const;
  const std::vector<uint32_t>& slots() const { return physical_; }

 private:
  std::vector<uint32_t> physical_;  // logical -> physical
  std::vector<uint32_t> logical_;   // physical -> logical
};

// experts/layer_NNN.map inside a packed model directory.
std::filesystem::path expert_map_path(const std::filesystem::path& model_dir, int layer);

std::string encode_expert_map(const ExpertMap& map);

// Validates magic, version, size, checksum and the permutation; throws FormatError naming
// `path` and the field (and offset) at fault.
ExpertMap decode_expert_map(std::string_view bytes, const std::filesystem::path& path);

ExpertMap read_expert_map(const std::filesystem::path& path);

// Writes atomically (temp + fsync + rename).
void write_expert_map(const std::filesystem::path& path, const ExpertMap& map);

// The map at `path`, or the identity over n_experts when no such file exists. Throws FormatError
// when the file exists but is invalid or its n differs from n_experts.
ExpertMap load_expert_map_file(const std::filesystem::path& path, uint32_t n_experts);

// load_expert_map_file(expert_map_path(model_dir, layer), n_experts).
ExpertMap load_expert_map(const std::filesystem::path& model_dir, int layer, uint32_t n_experts);

}  // namespace moestream
