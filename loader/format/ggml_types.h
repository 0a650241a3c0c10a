// The tensor element types of ggml (llama.cpp's tensor library) as GGUF files store them: the
// type ids of the GGUF tensor table, and each type's block geometry. A row of n elements of a
// block type is n / block_elems blocks of block_bytes each, back to back; GGUF requires every
// row length to be a multiple of block_elems.
//
// The ids and sizes are ggml's public file format (also in the `gguf` PyPI package,
// gguf.constants.GGML_QUANT_SIZES). Retired ids (4, 5, 31-33, 36-38) are unknown here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moestream {

enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39, kNVFP4 = 40,
};

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // as ggml and the gguf package spell it: "Q4_K", "BF16", ...
  uint32_t block_elems;   // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block
};

// The geometry of a known type id, or nullopt for an id this build does not know.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
std::optional<GgmlTypeInfo> ggml_type_info_by_name(std::string_view name);  // case-sensitive
std::string_view ggml_type_name(GgmlType t);  // "?" never: every enumerator is in the table

// Bytes of one row of n elements; nullopt when n is not a multiple of the block or the size overflows.
std::optional<uint64_t> ggml_row_bytes(GgmlType t, uint64_t n);

}  // namespace moestream
