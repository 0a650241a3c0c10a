// The per-layer expert file `experts/layer_NNN.bin` of a packed model: its on-disk format, the
// byte layout of one expert inside it, and a reader that validates every field on open.
//
// File layout (all integers little-endian):
//   offset  size        field
//   0       8           magic "MOEXPRT\0"
//   8       4           version: 1, or 2 when the matrices have ggml types or differ (below)
//   12      4           quant type (QuantType: 0 f32, 1 bf16, 2 q8, 3 q4); in version 2 gate's type
//   16      4           layer index
//   20      4           n_experts
//   24      4           hidden size D (model width)
//   28      4           intermediate size F (expert width)
//   32      8           expert_bytes: payload bytes of one expert (ExpertLayout::bytes)
//   40      8           expert_stride: bytes between slots, a multiple of 4096, >= expert_bytes
//   48      8           data_offset: start of slot 0, a multiple of 4096
//   56      8           header checksum: XXH64 (seed 0) of bytes [0, 56) followed by [64, T + 8*n_experts)
//   T       8*n_experts per-slot checksum of the expert_bytes payload held in that slot: XXH64
//                       (seed 0), or XXH3-64 (seed 0) with flags bit 1; at T = 64 in version 1 and
//                       T = 80 in version 2, which adds:
//     64    4           up's type, 68: down's type (QuantType: a pack type or kGgmlQuantBase + ggml id)
//     72    4           flags: bit 0 = the payload ends with an f32 bias section (below); bit 1 =
//                       the slot checksums are XXH3-64, not XXH64; others zero
//     76    4           reserved, zero
//   ...     zero padding up to data_offset = align_up(T + 8*n_experts, 4096)
//   data_offset + s*expert_stride: the expert in physical slot s, zero padded to the stride.
// The file is exactly data_offset + n_experts*expert_stride bytes. Without a `.map` file,
// physical slot s holds logical expert s. A `.map` (expert_map.h) is bound to the file by
// slot_table_hash: XXH64 (seed 0) over bytes [T, T + 8*n_experts), the per-slot checksum table
// as stored. It changes whenever a different payload sits in some slot, so a map written for
// another order (or another layer or model) is refused instead of reading the wrong experts.
//
// One expert's payload is three matrices back to back, each starting 64-byte aligned:
//   gate [F x D], up [F x D], down [D x F]   (rows x cols, row-major; rows are outputs)
// and, with header flag bit 0 (gpt-oss's expert biases; version 2 only), a bias section, 64-byte
// aligned after down: float32 gate_bias [F], up_bias [F], down_bias [D].
// A matrix of R rows and C columns is encoded by quant type as:
//   f32:  R*C float32
//   bf16: R*C bfloat16 (upper 16 bits of the float32)
//   q8:   nb = ceil(C/32) blocks per row, columns past C zero padded. Rows back to back, each
//         row_bytes = nb*34: nb float16 scales, then nb*32 int8 quants; x = q * d,
//         d = amax/127 over the block, q in [-127, 127].
//   q4:   rows back to back, each row_bytes = nb*18: nb float16 scales, then nb*16 bytes;
//         byte j of a block holds element j in its low nibble and element j+16 in its high
//         nibble; x = (nibble - 8) * d, with d = m / -8 where m is the block's element of
//         largest magnitude (sign kept). 4.5 bits per weight.
//   ggml types (version 2, from a GGUF): R rows of ggml_row_bytes(type, C), ggml's block layout
//   (loader/format/ggml_types.h), C a whole number of the type's blocks.
//   Writers hash payloads with XXH3-64 (about twice XXH64's speed from memory: a first use's
//   check and a streamed expert's cost half), so they write version 2; version 1 (XXH64, one pack
//   type) and version 2 with XXH64 are what earlier builds wrote, and every reader takes all three.
//   Each row is self-contained so that a row range [r0, r1) is one contiguous byte range
//   (threads, partial reads) and a matvec needs no total row count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loader/format/ggml_types.h"

namespace moestream {

// The encoding of a weight matrix. The four pack types are the ones an expert file (below) holds;
// QuantType also names ggml's block types (loader/format/ggml_types.h), for weights computed in
// place from GGUF files: kGgmlQuantBase + the ggml type id (ggml_quant(), quant_ggml_type()).
enum class QuantType : uint32_t { kF32 = 0, kBF16 = 1, kQ8 = 2, kQ4 = 3 };
inline constexpr uint32_t kGgmlQuantBase = 0x100;
constexpr QuantType ggml_quant(GgmlType t) { return static_cast<QuantType>(kGgmlQuantBase + static_cast<uint32_t>(t)); }
std::optional<GgmlType> quant_ggml_type(QuantType q);  // nullopt for the pack types

inline constexpr char kExpertFileMagic[8] = {'M', 'O', 'E', 'X', 'P', 'R', 'T', '\0'};
inline constexpr uint32_t kExpertFileVersion = 1;       // one pack type for all three matrices
inline constexpr uint32_t kExpertFileVersionTyped = 2;  // a type per matrix, ggml types allowed
inline constexpr size_t kExpertAlign = 4096;   // slot alignment: O_DIRECT and page granularity
inline constexpr size_t kMatrixAlign = 64;     // matrix alignment inside a slot: one cache line
inline constexpr int kQuantBlock = 32;         // q8/q4 block length along a row

std::string_view quant_name(QuantType q);      // "f32", "bf16", "q8", "q4"; ggml's names ("Q4_K")
QuantType parse_quant(std::string_view name);  // a pack type; throws ConfigError naming the bad value
// A pack type ("q4") or a ggml type by ggml's name ("Q4_K"): what model.json's per-layer types
// hold. ConfigError naming the bad value.
QuantType parse_stored_quant(std::string_view name);
// True for the four types of version-1 expert files (and model.json version 1).
constexpr bool is_pack_quant(QuantType q) { return static_cast<uint32_t>(q) <= static_cast<uint32_t>(QuantType::kQ4); }

// Bytes of one R x C matrix in quant type q (see the layout above; ggml types: R rows of
// ggml_row_bytes, ConfigError when C is not a multiple of the type's block).
size_t quant_matrix_bytes(QuantType q, size_t rows, size_t cols);

// The encodings of an expert's three matrices: one type in a pack, possibly three in a GGUF
// (and different from layer to layer).
struct ExpertTypes {
  QuantType gate = QuantType::kF32, up = QuantType::kF32, down = QuantType::kF32;
  bool bias = false;  // gpt-oss: the payload ends with f32 gate/up/down biases (header flag bit 0)
  static ExpertTypes uniform(QuantType q) { return {q, q, q}; }
  bool operator==(const ExpertTypes& o) const {
    return gate == o.gate && up == o.up && down == o.down && bias == o.bias;
  }
};

// Where gate, up and down sit inside one expert's payload, and their encodings.
struct ExpertLayout {
  size_t gate_offset = 0, up_offset = 0, down_offset = 0;
  size_t bias_offset = 0;  // types.bias: f32 gate_bias [F], up_bias [F], down_bias [D]; else 0
  size_t bytes = 0;  // payload bytes (expert_bytes in the header)
  ExpertTypes types;
  static ExpertLayout make(QuantType q, size_t hidden, size_t intermediate);
  static ExpertLayout make(const ExpertTypes& types, size_t hidden, size_t intermediate);
};

// How a file's slot checksums hash a payload (seed 0 either way).
enum class PayloadHash : uint8_t { kXxh64, kXxh3 };

struct ExpertFileHeader {
  uint32_t version = kExpertFileVersion;
  QuantType quant = QuantType::kF32;  // version 1: all three matrices; version 2: gate
  uint32_t layer = 0;
  uint32_t n_experts = 0;
  uint32_t hidden = 0;
  uint32_t intermediate = 0;
  uint64_t expert_bytes = 0;
  uint64_t expert_stride = 0;
  uint64_t data_offset = 0;
  std::vector<uint64_t> slot_checksums;  // indexed by physical slot
  QuantType up_quant = QuantType::kF32, down_quant = QuantType::kF32;  // version 2 only
  bool bias = false;  // version 2 only: flags bit 0
  PayloadHash payload_hash = PayloadHash::kXxh3;  // kXxh3: version 2 flags bit 1; what writers use

  ExpertTypes types() const {
    return version == kExpertFileVersion ? ExpertTypes::uniform(quant)
                                         : ExpertTypes{quant, up_quant, down_quant, bias};
  }
  // Sets the matrices' types and the version they need (1 only when one pack type covers all
  // three, there are no biases and the payloads hash with XXH64).
  void set_types(const ExpertTypes& t);
  // Start of the slot checksum table: 64 (version 1) or 80 (version 2).
  uint64_t table_offset() const;
  uint64_t slot_offset(uint32_t slot) const { return data_offset + uint64_t{slot} * expert_stride; }
  uint64_t file_bytes() const { return data_offset + uint64_t{n_experts} * expert_stride; }
};

// The data_offset a header of this version and expert count must have.
uint64_t expert_data_offset(uint32_t version, uint32_t n_experts);

// Serialises the header page(s): exactly data_offset bytes, checksum filled in.
std::string encode_expert_header(const ExpertFileHeader& h);

// Parses and validates a header read from `path` of `file_size` bytes: magic, version, types,
// sizes consistent with ExpertLayout, alignment, header checksum, file size. Throws FormatError
// naming the path and the field.
ExpertFileHeader decode_expert_header(std::string_view bytes, uint64_t file_size,
                                      const std::filesystem::path& path);

// Reads and validates the header of an expert file.
ExpertFileHeader read_expert_header(const std::filesystem::path& path);

// XXH64 (seed 0) over the per-slot checksum table as stored (8 bytes little-endian per slot, slot
// order): an identity of which payload sits in which slot, what an expert map is bound to.
uint64_t slot_table_hash(const std::vector<uint64_t>& slot_checksums);

// The slot checksum of an expert payload: XXH64 or XXH3-64 (seed 0), as the file says.
uint64_t expert_checksum(PayloadHash hash, const void* data, size_t bytes);

// Path of layer `layer`'s expert file inside a packed model directory: experts/layer_NNN.bin.
std::filesystem::path expert_file_path(const std::filesystem::path& model_dir, int layer);

}  // namespace moestream
