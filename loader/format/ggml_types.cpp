#include "loader/format/ggml_types.h"

#include <array>

namespace moestream {
namespace {

using T = GgmlType;
constexpr std::array kTypes = {
    GgmlTypeInfo{T::kF32, "F32", 1, 4},          GgmlTypeInfo{T::kF16, "F16", 1, 2},
    GgmlTypeInfo{T::kQ4_0, "Q4_0", 32, 18},      GgmlTypeInfo{T::kQ4_1, "Q4_1", 32, 20},
    GgmlTypeInfo{T::kQ5_0, "Q5_0", 32, 22},      GgmlTypeInfo{T::kQ5_1, "Q5_1", 32, 24},
    GgmlTypeInfo{T::kQ8_0, "Q8_0", 32, 34},      GgmlTypeInfo{T::kQ8_1, "Q8_1", 32, 40},
    GgmlTypeInfo{T::kQ2_K, "Q2_K", 256, 84},     GgmlTypeInfo{T::kQ3_K, "Q3_K", 256, 110},
    GgmlTypeInfo{T::kQ4_K, "Q4_K", 256, 144},    GgmlTypeInfo{T::kQ5_K, "Q5_K", 256, 176},
    GgmlTypeInfo{T::kQ6_K, "Q6_K", 256, 210},    GgmlTypeInfo{T::kQ8_K, "Q8_K", 256, 292},
    GgmlTypeInfo{T::kIQ2_XXS, "IQ2_XXS", 256, 66}, GgmlTypeInfo{T::kIQ2_XS, "IQ2_XS", 256, 74},
    GgmlTypeInfo{T::kIQ3_XXS, "IQ3_XXS", 256, 98}, GgmlTypeInfo{T::kIQ1_S, "IQ1_S", 256, 50},
    GgmlTypeInfo{T::kIQ4_NL, "IQ4_NL", 32, 18},  GgmlTypeInfo{T::kIQ3_S, "IQ3_S", 256, 110},
    GgmlTypeInfo{T::kIQ2_S, "IQ2_S", 256, 82},   GgmlTypeInfo{T::kIQ4_XS, "IQ4_XS", 256, 136},
    GgmlTypeInfo{T::kI8, "I8", 1, 1},            GgmlTypeInfo{T::kI16, "I16", 1, 2},
    GgmlTypeInfo{T::kI32, "I32", 1, 4},          GgmlTypeInfo{T::kI64, "I64", 1, 8},
    GgmlTypeInfo{T::kF64, "F64", 1, 8},          GgmlTypeInfo{T::kIQ1_M, "IQ1_M", 256, 56},
    GgmlTypeInfo{T::kBF16, "BF16", 1, 2},        GgmlTypeInfo{T::kTQ1_0, "TQ1_0", 256, 54},
    GgmlTypeInfo{T::kTQ2_0, "TQ2_0", 256, 66},   GgmlTypeInfo{T::kMXFP4, "MXFP4", 32, 17},
    GgmlTypeInfo{T::kNVFP4, "NVFP4", 64, 36},
};

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

std::optional<GgmlTypeInfo> ggml_type_info_by_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name == name) return t;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(GgmlType t) { return ggml_type_info(static_cast<uint32_t>(t))->name; }

std::optional<uint64_t> ggml_row_bytes(GgmlType t, uint64_t n) {
  const auto info = ggml_type_info(static_cast<uint32_t>(t));
  if (!info || n % info->block_elems != 0) return std::nullopt;
  const uint64_t blocks = n / info->block_elems;
  if (blocks > UINT64_MAX / info->block_bytes) return std::nullopt;
  return blocks * info->block_bytes;
}

}  // namespace moestream
