// The whole-file checksum of a pack's dense weights (model.json's dense.xxh3): written by the
// converters, verified once at load unless checksums are off (`verify_checksums=false`), so a dense file
// corrupted or changed between runs is refused instead of computed (docs/format.md).
#pragma once

#include <filesystem>
#include <string>

#include "loader/format/model_config.h"

namespace moestream {

// XXH3-64 (seed 0) of the whole file, as 16 lowercase hex digits; IoError naming the file and
// offset when it cannot be read.
std::string dense_file_checksum(const std::filesystem::path& file);

// Hashes dir / cfg.dense_file and compares it with cfg.dense_xxh3 (nothing when that is empty: a
// pack written before the field, or a GGUF model, which carries no checksum). FormatError naming
// the file, both values and how to skip the check when they differ.
void verify_dense_checksum(const std::filesystem::path& dir, const ModelConfig& cfg);

}  // namespace moestream
