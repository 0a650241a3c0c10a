// The runtime's only way to get expert weights: per layer it asks for the selected expert ids and
// receives pointers to their encoded payloads (loader/expert_file.h layout). What sits behind it
// (pread now, the io_uring engine and caches later) is invisible to the forward pass.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "runtime/model_config.h"

namespace moestream {

struct ExpertStoreStats {
  uint64_t fetch_calls = 0;     // fetch() calls
  uint64_t experts_requested = 0;
  uint64_t experts_read = 0;    // experts that had to be read from a file
  uint64_t bytes_read = 0;
  double io_seconds = 0;        // wall time spent waiting for reads
};

class ExpertStore {
 public:
  virtual ~ExpertStore() = default;

  // Makes logical experts `ids` of `layer` available. On return out[i] points to the payload of
  // ids[i] (ExpertLayout::make(quant, D, F).bytes bytes). Pointers stay valid until the next
  // fetch() call on this store. Throws IoError/FormatError (checksum) naming file and offset.
  virtual void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) = 0;

  virtual ExpertStoreStats stats() const = 0;
};

struct ExpertStoreOptions {
  bool verify_checksums = true;  // verify XXH64 of each expert on every read
};

// Reads experts with pread(2) from `model_dir/experts/layer_NNN.bin`. Validates every layer
// file's header against `cfg` on open.
std::unique_ptr<ExpertStore> open_pread_expert_store(const std::filesystem::path& model_dir,
                                                     const ModelConfig& cfg,
                                                     const ExpertStoreOptions& opts = {});

}  // namespace moestream
