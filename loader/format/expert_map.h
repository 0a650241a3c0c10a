// The per-layer expert map `experts/layer_NNN.map`: which physical slot of layer_NNN.bin holds
// each logical expert, written by the clustering tools; identity when the file is absent.
//
// File layout (all integers little-endian), version 2, exactly 32 + 4*n bytes:
//   offset   size  field
//   0        8     magic "MOEXMAP\0"
//   8        4     version (kExpertMapVersion = 2)
//   12       4     n: number of experts (must equal the layer's n_experts)
//   16       4*n   uint32 physical slot of logical expert i, for i = 0..n-1; a permutation of
//                  0..n-1 (every slot exactly once)
//   16+4n    8     file binding: slot_table_hash (expert_file.h) of the layer file this map
//                  describes, i.e. XXH64 over that file's per-slot checksum table in slot order
//   24+4n    8     checksum: XXH64 (seed 0) of bytes [0, 24+4n)
//
// Why the binding: the layer file's checksums follow the physical slot, so a valid permutation
// next to a file laid out in another order reads the wrong experts and every checksum still
// passes. The binding names the exact slot order (which payload sits in which slot) the map was
// written for; the loader (load_bound_expert_map) refuses a map whose binding differs from the
// file beside it, naming both files. A repack writes file and map together, so they agree;
// `cluster_experts --maps-out` binds each map to the file a repack in that order would write, so
// such a map is refused next to the un-repacked file.
//
// Version 1 (what moestream wrote before maps were bound) is the same without the binding field
// (24 + 4*n bytes). It is still decoded, but nothing ties it to a file: the loader accepts a
// version-1 map only when it is the identity (it then changes nothing) and refuses any other with
// a message pointing to `cluster_experts --model DIR --bind-legacy-maps`, which binds the maps of
// a model repacked by that earlier version to its files (only the user can vouch that they still
// belong together).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moestream {

inline constexpr char kExpertMapMagic[8] = {'M', 'O', 'E', 'X', 'M', 'A', 'P', '\0'};
inline constexpr uint32_t kExpertMapVersion = 2;
inline constexpr uint32_t kExpertMapLegacyVersion = 1;  // no file binding

struct ExpertFileHeader;

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

  // The slot_table_hash of the layer file this map describes; none for a version-1 map.
  std::optional<uint64_t> file_binding() const { return binding_; }
  // This map bound to a layer file whose slot_table_hash is `table_hash`.
  ExpertMap bound_to(uint64_t table_hash) const;

 private:
  std::vector<uint32_t> physical_;  // logical -> physical
  std::vector<uint32_t> logical_;   // physical -> logical
  std::optional<uint64_t> binding_;
};

// experts/layer_NNN.map inside a packed model directory.
std::filesystem::path expert_map_path(const std::filesystem::path& model_dir, int layer);

// Version 2 for a bound map; version 1 (the legacy layout, which loaders accept only for the
// identity) for a map without a binding.
std::string encode_expert_map(const ExpertMap& map);

// Validates magic, version (1 or 2), size, checksum and the permutation; throws FormatError
// naming `path` and the field (and offset) at fault. Does not look at any layer file.
ExpertMap decode_expert_map(std::string_view bytes, const std::filesystem::path& path);

ExpertMap read_expert_map(const std::filesystem::path& path);

// Writes atomically (temp + fsync + rename).
void write_expert_map(const std::filesystem::path& path, const ExpertMap& map);

// The map at `path`, or the identity over n_experts when no such file exists. Throws FormatError
// when the file exists but is invalid or its n differs from n_experts. Unchecked against any
// layer file: for inspection and tests; whatever reads experts through a map uses
// load_bound_expert_map.
ExpertMap load_expert_map_file(const std::filesystem::path& path, uint32_t n_experts);

// load_expert_map_file(expert_map_path(model_dir, layer), n_experts).
ExpertMap load_expert_map(const std::filesystem::path& model_dir, int layer, uint32_t n_experts);

// The map at `map_path` for the layer file `file` whose validated header is `h`: the identity when
// no map exists; otherwise the map, after checking it describes this file (version 2: its binding
// equals slot_table_hash(h); version 1: only the identity). Throws FormatError naming both files
// when they do not belong together.
ExpertMap load_bound_expert_map(const std::filesystem::path& map_path, const ExpertFileHeader& h,
                                const std::filesystem::path& file);

}  // namespace moestream
