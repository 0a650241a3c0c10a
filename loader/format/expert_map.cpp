// Reading, validating and atomically writing the per-layer logical -> physical expert maps.
#include "loader/format/expert_map.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <system_error>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/file_util.h"
#include "common/load_le.h"
#include "loader/format/expert_file.h"

namespace moestream {
namespace {

constexpr size_t kHeaderBytes = 16;

uint32_t load_u32(const char* p) { return load_le<uint32_t>(p); }
uint64_t load_u64(const char* p) { return load_le<uint64_t>(p); }
void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

ExpertMap ExpertMap::identity(uint32_t n) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  return from_slots(std::move(p));
}

ExpertMap ExpertMap::from_slots(std::vector<uint32_t> physical, std::string_view what) {
  const uint32_t n = static_cast<uint32_t>(physical.size());
  std::vector<uint32_t> logical(n, UINT32_MAX);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t s = physical[i];
    if (s >= n)
      throw FormatError(std::string(what) + ": logical expert " + std::to_string(i) +
                        " maps to slot " + std::to_string(s) + ", out of range for " +
                        std::to_string(n) + " experts");
    if (logical[s] != UINT32_MAX)
      throw FormatError(std::string(what) + ": not a permutation: slot " + std::to_string(s) +
                        " holds both logical experts " + std::to_string(logical[s]) + " and " +
                        std::to_string(i));
    logical[s] = i;
  }
  ExpertMap m;
  m.physical_ = std::move(physical);
  m.logical_ = std::move(logical);
  return m;
}

ExpertMap ExpertMap::bound_to(uint64_t table_hash) const {
  ExpertMap m = *this;
  m.binding_ = table_hash;
  return m;
}

bool ExpertMap::is_identity() const {
  for (uint32_t i = 0; i < physical_.size(); ++i)
    if (physical_[i] != i) return false;
  return true;
}

std::filesystem::path expert_map_path(const std::filesystem::path& model_dir, int layer) {
  char name[32];
  std::snprintf(name, sizeof name, "layer_%03d.map", layer);
  return model_dir / "experts" / name;
}

std::string encode_expert_map(const ExpertMap& map) {
  std::string s(kExpertMapMagic, sizeof kExpertMapMagic);
  const std::optional<uint64_t> binding = map.file_binding();
  put_u32(s, binding ? kExpertMapVersion : kExpertMapLegacyVersion);
  put_u32(s, map.size());
  for (uint32_t v : map.slots()) put_u32(s, v);
  if (binding) put_u64(s, *binding);
  put_u64(s, XXH64(s.data(), s.size(), 0));
  return s;
}

ExpertMap decode_expert_map(std::string_view bytes, const std::filesystem::path& path) {
  const std::string where = path.string();
  if (bytes.size() < kHeaderBytes + 8)
    throw FormatError(where + ": truncated expert map: " + std::to_string(bytes.size()) +
                      " bytes, a map has at least " + std::to_string(kHeaderBytes + 8));
  if (std::memcmp(bytes.data(), kExpertMapMagic, sizeof kExpertMapMagic) != 0)
    throw FormatError(where + ": bad magic at offset 0 (not an expert map)");
  uint32_t version = load_u32(bytes.data() + 8);
  if (version != kExpertMapVersion && version != kExpertMapLegacyVersion)
    throw FormatError(where + ": unsupported version " + std::to_string(version) +
                      " at offset 8 (expected " + std::to_string(kExpertMapLegacyVersion) + " or " +
                      std::to_string(kExpertMapVersion) + ")");
  const bool bound = version == kExpertMapVersion;
  uint64_t n = load_u32(bytes.data() + 12);
  uint64_t expected = kHeaderBytes + 4 * n + (bound ? 16 : 8);
  if (bytes.size() != expected)
    throw FormatError(where + ": " + (bytes.size() < expected ? "truncated" : "oversized") +
                      " expert map: n = " + std::to_string(n) + " at offset 12 needs " +
                      std::to_string(expected) + " bytes, file has " +
                      std::to_string(bytes.size()));
  size_t body = kHeaderBytes + 4 * n + (bound ? 8 : 0);
  uint64_t stored = load_u64(bytes.data() + body);
  uint64_t actual = XXH64(bytes.data(), body, 0);
  if (stored != actual)
    throw FormatError(where + ": checksum mismatch at offset " + std::to_string(body) +
                      " (stored " + std::to_string(stored) + ", computed " +
                      std::to_string(actual) + ")");
  std::vector<uint32_t> slots(n);
  for (uint64_t i = 0; i < n; ++i) slots[i] = load_u32(bytes.data() + kHeaderBytes + 4 * i);
  ExpertMap m = ExpertMap::from_slots(std::move(slots), where);
  return bound ? m.bound_to(load_u64(bytes.data() + kHeaderBytes + 4 * n)) : m;
}

ExpertMap read_expert_map(const std::filesystem::path& path) {
  return decode_expert_map(read_file(path), path);
}

void write_expert_map(const std::filesystem::path& path, const ExpertMap& map) {
  write_file_atomic(path, encode_expert_map(map));
}

ExpertMap load_expert_map(const std::filesystem::path& model_dir, int layer, uint32_t n_experts) {
  return load_expert_map_file(expert_map_path(model_dir, layer), n_experts);
}

ExpertMap load_expert_map_file(const std::filesystem::path& p, uint32_t n_experts) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    if (ec) throw IoError("cannot stat " + p.string() + ": " + ec.message());
    return ExpertMap::identity(n_experts);
  }
  ExpertMap m = read_expert_map(p);
  if (m.size() != n_experts)
    throw FormatError(p.string() + ": map has n = " + std::to_string(m.size()) +
                      " experts at offset 12, the layer has " + std::to_string(n_experts));
  return m;
}

ExpertMap load_bound_expert_map(const std::filesystem::path& map_path, const ExpertFileHeader& h,
                                const std::filesystem::path& file) {
  ExpertMap m = load_expert_map_file(map_path, h.n_experts);
  const std::optional<uint64_t> binding = m.file_binding();
  if (binding) {
    const uint64_t actual = slot_table_hash(h.slot_checksums);
    if (*binding != actual)
      throw FormatError(map_path.string() + " does not describe " + file.string() +
                        ": the map is bound to a layer file whose slot checksum table hashes to " +
                        hex64(*binding) + ", this file's hashes to " + hex64(actual) +
                        ". The map was written for another slot order (a " + option_ref("maps_out") + " map of a file "
                        "that was not repacked, or a map of another layer or model, or the file "
                        "was replaced since its repack); reading through it would fetch the wrong "
                        "experts. Remove the map if the file is in its original order, or repack "
                        "with cluster_experts --repack to install a matching file and map");
    return m;
  }
  // No such file (identity) or a legacy version-1 map: only the identity is safe without a binding.
  if (m.is_identity()) return m;
  throw FormatError(map_path.string() + " is a version-1 map (written before maps were bound to "
                    "their layer files) with a non-identity order, and nothing shows that " +
                    file.string() + " was repacked in that order; reading through it could fetch "
                    "the wrong experts. If this model was repacked by that earlier moestream and "
                    "its experts/ files were not changed since, run cluster_experts --model DIR "
                    "--bind-legacy-maps once to bind the maps; otherwise remove the map");
}

}  // namespace moestream
