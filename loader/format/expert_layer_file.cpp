// Implementation of loader/format/expert_layer_file.h.
#include "loader/format/expert_layer_file.h"

#include <cstdio>
#include <string>

#include "common/error.h"

namespace moestream {
namespace {

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void check_against_config(const ExpertLayerFile& f, int layer, const ModelConfig& cfg) {
  auto mismatch = [&](const char* field, const std::string& got, const std::string& want) {
    throw FormatError(f.path.string() + ": header field '" + field + "' is " + got +
                      " but model.json says " + want);
  };
  const ExpertFileHeader& h = f.header;
  const ExpertTypes want = cfg.expert_layout(layer).types, got = h.types();
  const auto names = [](const ExpertTypes& t) {
    return std::string(quant_name(t.gate)) + "/" + std::string(quant_name(t.up)) + "/" + std::string(quant_name(t.down));
  };
  if (got.gate != want.gate)
    mismatch("quant", std::string(quant_name(got.gate)), std::string(quant_name(want.gate)));
  if (got.bias != want.bias)  // gpt-oss's bias section: the payload size and the maths differ
    mismatch("flags (expert biases)", got.bias ? "set" : "clear", want.bias ? "experts.bias true" : "no expert biases");
  if (!(got == want)) mismatch("quant (gate/up/down)", names(got), names(want));
  if (h.layer != static_cast<uint32_t>(layer)) mismatch("layer", std::to_string(h.layer), std::to_string(layer));
  if (h.n_experts != static_cast<uint32_t>(cfg.n_experts))
    mismatch("n_experts", std::to_string(h.n_experts), std::to_string(cfg.n_experts));
  if (h.hidden != static_cast<uint32_t>(cfg.hidden_size))
    mismatch("hidden", std::to_string(h.hidden), std::to_string(cfg.hidden_size));
  if (h.intermediate != static_cast<uint32_t>(cfg.moe_intermediate_size))
    mismatch("intermediate", std::to_string(h.intermediate), std::to_string(cfg.moe_intermediate_size));
}

}  // namespace

ExpertLayerFile open_expert_layer_file(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                       int layer, bool use_map) {
  char name[32];
  std::snprintf(name, sizeof name, "layer_%03d", layer);
  const std::filesystem::path dir = model_dir / cfg.experts_dir;
  ExpertLayerFile f;
  f.path = dir / (std::string(name) + ".bin");
  // Symlinks resolved, the layer file and its map stay inside the model directory.
  const std::filesystem::path rel = std::filesystem::path(cfg.experts_dir) / name;
  check_model_file(model_dir, rel.string() + ".bin", "expert layer file");
  const std::filesystem::path map_path = check_model_file(model_dir, rel.string() + ".map", "expert map");
  f.header = read_expert_header(f.path);
  check_against_config(f, layer, cfg);
  f.map = use_map ? load_bound_expert_map(map_path, f.header, f.path) : ExpertMap::identity(f.header.n_experts);
  return f;
}

FormatError expert_checksum_error(const ExpertLayerFile& f, uint32_t slot, size_t bytes, uint64_t got) {
  return FormatError(f.path.string() + ": checksum mismatch for expert " +
                     std::to_string(f.map.logical(slot)) + " (physical slot " + std::to_string(slot) +
                     " at offset " + std::to_string(f.header.slot_offset(slot)) + ", " +
                     std::to_string(bytes) + " bytes): header says " +
                     hex64(f.header.slot_checksums[slot]) + ", data hashes to " + hex64(got));
}

}  // namespace moestream
