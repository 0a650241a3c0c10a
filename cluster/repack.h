// Physical repack: rewrites every layer file so that slot order follows a new expert map, and
// installs files and maps together, so that a model on disk never pairs a map with the wrong file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "loader/format/expert_map.h"

namespace moestream::cluster {

struct RepackOptions {
  // Test hook: called at named points ("layer N written", "before exchange"); throwing from it
  // simulates a failure there.
  std::function<void(const std::string& point)> fault;
  // Leave the staging directory behind on failure (what a crash does); the next run removes it.
  bool keep_staging_on_failure = false;
  std::function<void(int layer, int n_layers)> progress;
};

// Staging directory a repack builds before the swap: <model_dir>/experts.repack.
std::filesystem::path repack_staging_dir(const std::filesystem::path& model_dir);

// For each layer l, writes <staging>/layer_NNN.bin with logical expert e in slot
// new_maps[l].physical(e) (payloads verified against the old file's checksums on read, and the new
// file re-read and verified after fsync) and <staging>/layer_NNN.map; other files of experts/ are
// hard-linked (copied where links fail). Then exchanges staging and experts/ with one
// renameat2(RENAME_EXCHANGE), fsyncs the model directory and removes the old files. Before the
// exchange the original is untouched; after it the new one is complete: a crash at any point
// leaves a model whose maps match its files. A stale staging directory is removed first.
// Throws IoError/FormatError naming the file; ConfigError when a map's size is wrong or
// renameat2 is unsupported by the filesystem.
void repack_experts(const std::filesystem::path& model_dir, int n_layers,
                    const std::vector<ExpertMap>& new_maps, const RepackOptions& opts = {});

}  // namespace moestream::cluster
