// Internal to kernels/cpu/quant*.cpp and its tests: the scalar and AVX2 matvec kernels behind
// quant_matvec, and the int8 quantisation of the input vector that the q8/q4 kernels share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/format/expert_file.h"

namespace moestream::detail {

// x (cols floats) as int8 blocks of 32, like llama.cpp's q8_0 activations: per block
// d = amax/127 (float32, not rounded), qs = nearbyint(x * (127/amax)) in [-127, 127]; columns
// past `cols` are 0.
// Both kernels consume the same quantised x, so scalar and SIMD differ only in float summation
// order. Arrays hold nb = ceil(cols/32) blocks.
struct QuantizedActivations {
  const float* d = nullptr;       // nb scales
  const int8_t* qs = nullptr;     // nb*32 quants
  const uint8_t* abs_qs = nullptr;  // nb*32 |quants| (q8 kernel: maddubs needs an unsigned side)
  const float* sum8 = nullptr;    // nb values 8 * sum(qs of the block) (q4 kernel: nibble bias)
  // q4 kernel: blocks in pairs (2p, 2p+1) as 64 bytes [lo16(2p), lo16(2p+1), hi16(2p), hi16(2p+1)]
  // (lo16 = elements 0..15, hi16 = 16..31), matching one 32-byte load of two blocks' nibbles.
  // nb/2 pairs; an odd last block is read from qs.
  const int8_t* qs_pairs = nullptr;
};

// Fills caller-owned arrays of the sizes above (qs_pairs: (nb/2)*64 bytes).
void quantize_activations(const float* x, size_t cols, float* d, int8_t* qs, uint8_t* abs_qs,
                          float* sum8, int8_t* qs_pairs);

// The same, bit for bit (ties to even in both), with AVX2; used when avx2_usable().
void quantize_activations_avx2(const float* x, size_t cols, float* d, int8_t* qs, uint8_t* abs_qs,
                               float* sum8, int8_t* qs_pairs);

// `xa` is used for q8/q4 only; f32/bf16 read x.
void matvec_scalar(QuantType q, const uint8_t* w, size_t cols, const float* x,
                   const QuantizedActivations& xa, float* y, size_t row_begin, size_t row_end);
void matvec_avx2(QuantType q, const uint8_t* w, size_t cols, const float* x,
                 const QuantizedActivations& xa, float* y, size_t row_begin, size_t row_end);

// True when this binary has the AVX2 kernels and the CPU has AVX2, FMA and F16C.
bool avx2_usable();

}  // namespace moestream::detail
