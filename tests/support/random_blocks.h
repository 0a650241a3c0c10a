// Test support: random bytes for a matrix in one of ggml's block or plain types, for kernel and
// product tests that compare paths with each other (not against llama.cpp). Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#include "common/half.h"
#include "loader/format/ggml_types.h"

namespace moestream::test {

// n elements of a plain type (F32, F16 or BF16) at dst: N(0, sigma) floats, each rounded to the type.
inline void fill_random_floats(GgmlType t, uint8_t* dst, size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, sigma);
  for (size_t i = 0; i < n; ++i) {
    const float v = g(rng);
    if (t == GgmlType::kF32) {
      std::memcpy(dst + 4 * i, &v, 4);
    } else {
      const uint16_t h = t == GgmlType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
      std::memcpy(dst + 2 * i, &h, 2);
    }
  }
}

// `bytes` bytes of blocks of type t: random level bytes, each block's float16 scale d (at its
// start; Q6_K's, TQ1_0's and TQ2_0's end their block, IQ1_M's is the top nibbles of its last 4
// u16) scale x N(0, 1), and for the types with a min (Q2_K, Q4_K, Q5_K) the float16 dmin after d,
// scale / 2 x N(0, 1). NVFP4's four UE4M3 scales are powers of two within 2x of `scale` (any
// mantissa). Finite scales, so every product is finite.
inline void fill_random_blocks(GgmlType t, uint8_t* dst, size_t bytes, float scale, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (size_t i = 0; i < bytes; ++i) dst[i] = static_cast<uint8_t>(rng());
  const size_t block = ggml_type_info(uint32_t(t))->block_bytes;
  if (t == GgmlType::kNVFP4) {
    const int e = std::clamp(int(std::lround(std::log2(scale))) + 7, 1, 14);  // UE4M3 exponent, bias 7
    for (size_t off = 0; off < bytes; off += block)
      for (size_t s = 0; s < 4; ++s) dst[off + s] = static_cast<uint8_t>((e - int(rng() % 2)) << 3 | (rng() & 7));
    return;
  }
  const size_t scale_at = t == GgmlType::kQ6_K ? 208 : t == GgmlType::kTQ1_0 || t == GgmlType::kTQ2_0 ? block - 2 : 0;
  const bool has_min = t == GgmlType::kQ2_K || t == GgmlType::kQ4_K || t == GgmlType::kQ5_K;
  for (size_t off = 0; off < bytes; off += block) {
    const uint16_t d = f32_to_f16(scale * g(rng));
    if (t == GgmlType::kIQ1_M) {
      for (size_t w = 0; w < 4; ++w) {  // the 3-bit scales below each nibble stay random
        uint8_t* hi = dst + off + 48 + 2 * w + 1;
        *hi = static_cast<uint8_t>((*hi & 0x0f) | (((d >> (4 * w)) & 0xf) << 4));
      }
      continue;
    }
    std::memcpy(dst + off + scale_at, &d, 2);
    if (has_min) {
      const uint16_t dmin = f32_to_f16(0.5f * scale * g(rng));
      std::memcpy(dst + off + 2, &dmin, 2);
    }
  }
}

}  // namespace moestream::test
