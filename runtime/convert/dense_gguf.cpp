// Implementation of runtime/convert/dense_gguf.h.
#include "runtime/convert/dense_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/half.h"

namespace moestream {

std::vector<uint8_t> encode_dense_matrix(GgmlType t, const float* src, size_t rows, size_t cols) {
  const auto row = ggml_row_bytes(t, cols);
  MOE_ASSERT(row.has_value(), "dense matrix row is not whole blocks");
  std::vector<uint8_t> out(rows * size_t(*row));
  const size_t n = rows * cols;
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(out.data(), src, n * sizeof(float));
      break;
    case GgmlType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ8_0: {
      constexpr size_t kBlock = 32, kBlockBytes = 34;
      for (size_t b = 0; b < n / kBlock; ++b) {
        const float* x = src + b * kBlock;
        uint8_t* dst = out.data() + b * kBlockBytes;
        float amax = 0;
        for (size_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(dst, &dh, 2);
        for (size_t i = 0; i < kBlock; ++i) {
          const float q = std::nearbyint(x[i] * id);
          dst[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, q))));
        }
      }
      break;
    }
    default:
      MOE_ASSERT(false, "encode_dense_matrix: unsupported type " + std::string(ggml_type_name(t)));
  }
  return out;
}

GgmlType dense_q8_type(bool is_matrix, size_t cols) {
  if (!is_matrix) return GgmlType::kF32;
  return cols % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kBF16;
}

GgufMetadata dense_gguf_metadata(const GgufMetadata* tokenizer_source) {
  GgufMetadata md;
  md.add(kDenseGgufFormatKey, GgufValue::from_string("moestream-dense"));
  if (tokenizer_source != nullptr)
    for (const GgufKv& kv : tokenizer_source->entries())
      if (kv.key.rfind("tokenizer.", 0) == 0) md.add(kv.key, kv.value);
  return md;
}

}  // namespace moestream
