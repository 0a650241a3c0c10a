// Physical repack: rewrites every layer file so that slot order follows a new expert map, and
// installs files and maps together, so that a model on disk never pairs a map with the wrong file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "loader/format/expert_file.h"
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
// leaves a model whose maps match its files. A stale staging directory is removed first. Each
// installed map is bound to its new file (expert_map.h); the source's maps must be bound to the
// source files (or absent), else FormatError before anything is written.
// Throws IoError/FormatError naming the file; ConfigError when a map's size is wrong or
// renameat2 is unsupported by the filesystem.
void repack_experts(const std::filesystem::path& model_dir, int n_layers,
                    const std::vector<ExpertMap>& new_maps, const RepackOptions& opts = {});

// The per-slot checksum table of `h`'s file after a repack from `old_map` (the file's current
// map) to `new_map`: slot s then holds logical expert new_map.logical(s).
std::vector<uint64_t> repacked_checksums(const ExpertFileHeader& h, const ExpertMap& old_map,
                                         const ExpertMap& new_map);

// `new_maps`, each bound to the layer file a repack of model_dir in that order would write: what
// --maps-out writes, so that such a map is refused next to any other file (in particular the
// un-repacked one it was computed from).
std::vector<ExpertMap> bind_for_repack(const std::filesystem::path& model_dir,
                                       const std::vector<ExpertMap>& new_maps);

// Migration for models repacked before maps were bound: gives every version-1 map of model_dir
// the binding of the layer file beside it, taking the user's word that they belong together
// (true if experts/ was not changed since that repack). Bound maps are checked, not rewritten.
// Returns the number of maps bound.
int bind_legacy_maps(const std::filesystem::path& model_dir);

}  // namespace moestream::cluster
