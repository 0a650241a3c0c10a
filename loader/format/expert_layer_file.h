// What every expert store does first for each layer: read the expert file's header, check it
// against model.json, load its .map, and name a checksum mismatch the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "common/error.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/format/model_config.h"

namespace moestream {

struct ExpertLayerFile {
  std::filesystem::path path;
  ExpertFileHeader header;
  ExpertMap map;  // identity when the layer has no .map file (or when maps are not used)
};

// Opens layer `layer` of `model_dir`: header validated, then checked field by field against
// `cfg` (quant, layer, n_experts, hidden, intermediate); throws FormatError naming the file and
// the field. The map is loaded from layer_NNN.map beside the file when `use_map` is set, and
// refused (FormatError naming both files) unless it is bound to this file (expert_map.h).
ExpertLayerFile open_expert_layer_file(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                       int layer, bool use_map = true);

// The FormatError for an expert whose payload does not hash to the header's checksum.
FormatError expert_checksum_error(const ExpertLayerFile& f, uint32_t slot, size_t bytes, uint64_t got);

}  // namespace moestream
