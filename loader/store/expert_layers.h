// Where the engine store's experts are: logical id -> physical slot (a pack layer's .map, identity
// for a GGUF), slot -> the reads that fetch it (one piece in a pack, three slices in a GGUF), the
// files those reads go to, their page-cache residency probes and their read-only mappings (for
// experts computed in place). Opened once; read-only afterwards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "common/mapped_file.h"
#include "loader/format/expert_layer_file.h"
#include "loader/format/model_config.h"
#include "loader/io/io_engine.h"
#include "loader/io/residency.h"
#include "loader/store/expert_store.h"

namespace moestream::engine_store {

// One read of an expert: `length` bytes at offset + slot*stride of `file`, landing at
// dest_offset in the expert's payload. A pack expert is one piece, a GGUF expert three.
struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0, stride = 0, length = 0, dest_offset = 0;
  const PageCacheResidency* page_cache = nullptr;  // null for O_DIRECT files
  uint64_t at(uint32_t slot) const { return offset + uint64_t{slot} * stride; }
};

// A layer's experts. A pack layer keeps its file header (checksums, map); a GGUF layer has an
// empty checksum table and an identity map.
struct Layer : ExpertLayerFile {
  int index = 0;  // the MoE layer's number (in error messages)
  ExpertLayout layout;
  std::vector<Piece> pieces;
  int verified = -1;  // VerifiedPages index: a checksummed pack layer read through the page cache
  bool checksummed() const { return !header.slot_checksums.empty(); }
  // The physical slot of logical expert `id` (asserted in range).
  uint32_t slot_of(int id) const;
  // Whether every piece of the expert in `slot` is in the page cache (sampled).
  bool in_page_cache(uint32_t slot) const;
};

// Ids as a fetch reads them: `slots` the distinct physical slots in file order (neighbours in
// the file read as one extent), position[i] the index in `slots` of ids[i].
void slots_in_file_order(const Layer& L, std::span<const int> ids, std::vector<uint32_t>& slots,
                         std::vector<uint32_t>& position);

class ExpertFiles {
 public:
  // Opens every MoE layer of `model_dir` (a pack directory or a GGUF) into `engine`, validating
  // pack headers against `cfg` and each map (FormatError naming the file); `read_bytes` is the
  // 4 KiB rounded read of one pack expert (a layer whose stride is below it is refused).
  ExpertFiles(const std::filesystem::path& model_dir, const ModelConfig& cfg, bool use_maps, uint64_t read_bytes,
              IoEngine& engine);

  size_t n_layers() const { return layers_.size(); }
  Layer& layer(int l) { return layers_[size_t(l)]; }
  const Layer& layer(int l) const { return layers_[size_t(l)]; }
  const std::vector<Layer>& layers() const { return layers_; }

  // Whether experts of L may be handed out as mapped pages: every piece's file is mapped
  // (buffered). gpt-oss's GGUF biases (six slices) never are.
  bool in_place_allowed(const Layer& L) const;
  // The matrices of the expert in `slot` in the mapped files (FormatError when a slice lies outside
  // its file: offsets come from the file). A pack's expert is one piece at the layout's offsets, a
  // GGUF's three pieces in gate, up, down order.
  ExpertMatrices mapped_matrices(const Layer& L, uint32_t slot) const;
  // The whole-file mappings, as ExpertStore::mapped_regions hands them out.
  std::vector<ExpertStore::MappedRegion> regions() const;

 private:
  uint32_t add_file(const std::filesystem::path& path, IoEngine& engine);
  std::vector<std::unique_ptr<PageCacheResidency>> page_caches_;  // per engine file; null: O_DIRECT
  std::vector<std::unique_ptr<MappedFile>> maps_;                  // per engine file; null: O_DIRECT
  std::vector<Layer> layers_;
};

}  // namespace moestream::engine_store
