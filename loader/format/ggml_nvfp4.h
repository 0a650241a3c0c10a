// NVFP4, ggml's 64-element FP4 block with one UE4M3 scale per 16 elements: its layout and the
// decoding of its scales as tables, plain C++17 data that the CPU kernels (kernels/cpu/
// ggml_nvfp4*.cpp) and the CUDA codec (kernels/cuda/expert_gemm_ggml_legacy.cu) both read.
//
// Block (36 bytes): 4 scale bytes (sub-block s of 16 elements: byte s), then 32 bytes of E2M1
// nibbles: sub-block s is bytes 4 + 8s..4 + 8s + 7, element j the low nibble of byte j, element
// 8 + j its high nibble. Element value = scale(byte s) * E2M1(nibble), computed as gguf.quants
// does: (scale / 2) * doubled E2M1 value {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}; both factors
// have at most 4 significant bits, so the float32 product is exact.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moestream::detail {

constexpr size_t kNvfp4Block = 64;
constexpr size_t kNvfp4Bytes = 36;

// UE4M3 byte s as half its value, as gguf.quants decodes it: exponent bits 3-6 (bias 7),
// mantissa bits 0-2, bit 7 ignored; (1 + m/8) * 2^(e-7) / 2 = (8 + m) * 2^(e-11) for e > 0,
// m * 2^-9 / 2 for e = 0, and 0x7F (E4M3's NaN) as 0. Every value is exact in float32.
constexpr float nvfp4_half_scale(uint32_t s) {
  const uint32_t e = (s >> 3) & 0xfu, m = s & 7u;
  if (s == 0x7fu) return 0.0f;
  if (e == 0) return static_cast<float>(m) * (1.0f / 1024.0f);
  float v = static_cast<float>(8 + m) * (1.0f / 2048.0f);
  for (uint32_t i = 0; i < e; ++i) v *= 2.0f;
  return v;
}

struct Nvfp4HalfScales {
  float v[256];
};
constexpr Nvfp4HalfScales make_nvfp4_half_scales() {
  Nvfp4HalfScales t{};
  for (uint32_t s = 0; s < 256; ++s) t.v[s] = nvfp4_half_scale(s);
  return t;
}
alignas(64) inline constexpr Nvfp4HalfScales kNvfp4HalfScales = make_nvfp4_half_scales();

// The doubled E2M1 values of the 16 nibbles.
inline constexpr int8_t kE2m1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace moestream::detail
