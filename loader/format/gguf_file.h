// Reader of GGUF files (llama.cpp's model format), single files and split sets: metadata and the
// tensor table, validated; tensor bytes are left in the file for the caller to read.
//
// File layout (all integers little-endian; versions 2 and 3, which differ only in that v3 may be
// big-endian; big-endian files and version 1 are refused):
//   0   4  magic "GGUF"
//   4   4  u32 version
//   8   8  u64 tensor_count
//   16  8  u64 kv_count
//   24     kv_count x { string key; u32 value_type; value }
//          tensor_count x { string name; u32 n_dims; u64 ne[n_dims] (ne0 = row length first);
//                           u32 ggml_type; u64 offset (relative to the data section) }
//          padding to `general.alignment` (default 32)
//   data   tensor bytes; a tensor is ne[1]*ne[2]*ne[3] rows of ggml_row_bytes(type, ne0)
// string = u64 byte length + bytes (no terminator). A value is a fixed-size scalar, a string, or
// an array = u32 element type + u64 count + elements (the same encodings without the type tag;
// an element that is itself an array carries its own element type and count).
//
// Validation on open (FormatError naming the file and the key or tensor): magic, version, every
// length and count against the bytes left in the file and the limits below, value types, unique
// keys and tensor names, n_dims <= 4, dims >= 1, element count without overflow, known ggml type
// ids, rows that are whole blocks, `general.alignment` a power of two, offsets aligned, every
// tensor inside the file and no two overlapping. Reads are bounded positioned reads (pread).
//
// Split sets: NAME-0000K-of-0000N.gguf, K = 1..N. `split.no` (0-based), `split.count` and
// `split.tensors.count` (the set's total) in every shard; the model's metadata is the first
// shard's; each tensor lives in exactly one shard. docs/format.md#gguf.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loader/format/ggml_types.h"
#include "loader/format/gguf_metadata.h"

namespace moestream {

// Limits on what a GGUF may declare (real files are far below each): hostile counts and lengths
// are refused before anything is allocated for them.
inline constexpr uint64_t kGgufMaxKeyBytes = 1024;          // metadata keys and tensor names
inline constexpr uint64_t kGgufMaxStringBytes = 64ull << 20;  // one string value (chat templates)
inline constexpr uint64_t kGgufMaxArrayElems = 1ull << 26;  // one array (vocabularies are < 1M)
inline constexpr uint32_t kGgufMaxNesting = 8;              // arrays inside arrays
inline constexpr uint64_t kGgufMaxMetadataBytes = 512ull << 20;  // all key/values of one file
inline constexpr uint64_t kGgufMaxNestedArrays = 1ull << 20;     // arrays inside arrays, in all
inline constexpr uint64_t kGgufMaxKeys = 1ull << 16;            // real files have < 100
inline constexpr uint64_t kGgufMaxTensors = 1ull << 18;  // per-expert tensors of 256 experts: 50k
inline constexpr uint32_t kGgufMaxDims = 4;
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr uint32_t kGgufMaxAlignment = 1u << 20;

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<uint64_t> dims;  // ne0 (the row length) first, as GGUF stores them
  uint64_t n_elements = 0;
  uint64_t bytes = 0;          // dims[1..] rows of ggml_row_bytes(type, dims[0])
  uint64_t offset = 0;         // absolute offset in its file
  uint32_t shard = 0;          // index of its file in GgufModelFiles::paths() (0 in a GgufFile)
  uint64_t rows() const { return dims.empty() ? 0 : n_elements / dims[0]; }
};

// One GGUF file, parsed and validated; no file descriptor is kept.
class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);  // throws IoError / FormatError

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of the data section
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file order
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // FormatError naming file and tensor

 private:
  friend class GgufParser;
  std::filesystem::path path_;
  uint32_t version_ = 0;
  uint64_t file_bytes_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// The files of one model: a single GGUF, or every shard of a split set found from any one of
// them. Metadata is the first shard's; tensors carry the index of their shard.
class GgufModelFiles {
 public:
  explicit GgufModelFiles(const std::filesystem::path& any_file);  // IoError / FormatError

  const std::vector<std::filesystem::path>& paths() const { return paths_; }  // shard order
  size_t shard_count() const { return files_.size(); }
  const GgufFile& shard(size_t i) const { return files_.at(i); }
  const GgufMetadata& metadata() const { return files_.front().metadata(); }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // shard, then file order
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // FormatError naming set and tensor
  const std::filesystem::path& path_of(const GgufTensor& t) const { return paths_.at(t.shard); }

 private:
  std::string name_;  // for messages: the single path, or the set's first shard
  std::vector<std::filesystem::path> paths_;
  std::vector<GgufFile> files_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// The shard pattern NAME-0000K-of-0000N.gguf: (NAME prefix with directory, K, N), or nullopt.
struct GgufSplitName {
  std::filesystem::path prefix;
  uint32_t index = 0;  // K, 1-based
  uint32_t count = 0;  // N
};
std::optional<GgufSplitName> parse_gguf_split_name(const std::filesystem::path& p);
std::filesystem::path gguf_split_path(const std::filesystem::path& prefix, uint32_t index, uint32_t count);

}  // namespace moestream
