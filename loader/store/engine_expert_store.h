// The ExpertStore on the batch read engine (loader/io/io_engine.h): a layer's requested experts go
// through experts/layer_NNN.map to physical slots; host-cache hits are served without I/O and
// the misses are read in one sorted, coalesced batch on a background thread, each handed out
// as soon as it lands and its checksum holds.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "loader/io/io_engine.h"
#include "loader/store/expert_store.h"
#include "loader/format/model_config.h"

namespace moestream {

struct EngineExpertStoreOptions {
  ExpertStoreOptions store;  // checksum verification
  IoEngineOptions io;        // backend, O_DIRECT, queue depth, rings, coalescing
  bool use_maps = true;      // read layer_NNN.map files next to the layer files (identity if absent)
  // The store's own host expert cache (LFU with aging), meant for O_DIRECT reads where the page
  // cache is bypassed; 0 = none (buffered reads then use the OS page cache as the host tier).
  uint64_t host_cache_bytes = 0;
  // Before reading a miss through the page cache, sample whether it is resident there, to count
  // page-cache hits (two cachestat/mincore probes per missing expert).
  bool count_page_cache_hits = true;
};

// Opens every layer file through one IoEngine, validating headers against `cfg` and each
// layer's map (FormatError naming the file on a bad header or a map that is not a permutation).
std::unique_ptr<ExpertStore> open_engine_expert_store(const std::filesystem::path& model_dir,
                                                      const ModelConfig& cfg,
                                                      const EngineExpertStoreOptions& opts = {});

// Picks the store by name, as an `--io` flag would:
//   "simple"                        one blocking pread per expert (open_pread_expert_store)
//   "auto", "uring", "pread", "mmap" the engine store with that backend (opts.io.backend is set)
// Throws ConfigError naming the value otherwise.
std::unique_ptr<ExpertStore> open_expert_store(std::string_view io,
                                               const std::filesystem::path& model_dir,
                                               const ModelConfig& cfg,
                                               EngineExpertStoreOptions opts = {});

}  // namespace moestream
