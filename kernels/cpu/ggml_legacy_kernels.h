// Internal to kernels/cpu/ggml_legacy*.cpp and their tests: the int8-rounded inputs that the
// kernels of the 32-element block types share, and the AVX2 entry points of that family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/ggml_kernels.h"

namespace moestream::detail {

// n inputs of `cols` columns (a multiple of 32) rounded to int8 blocks of 32 by
// quantize_activations (quant_kernels.h): per block d = amax/127 and qs in [-127, 127], abs_qs =
// |qs|, sum8 = 8 * sum(qs), and pairs: blocks (2p, 2p+1) as 64 bytes [2p 0..15, 2p+1 0..15,
// 2p 16..31, 2p+1 16..31] (one 32-byte load of two blocks' nibbles meets its inputs). Input i's
// block b is at index i * stride + b (qs, abs_qs, pairs: times 32; pairs holds nb/2 pairs).
// stride is nb rounded up to a multiple of 8 and d, sum8 are 0 in the padding, so kernels may read
// scales 8 blocks at a time; the padding blocks' qs are never read.
struct GgmlActivations {
  size_t nb = 0;
  size_t stride = 0;
  const float* d = nullptr;
  const int8_t* qs = nullptr;
  const uint8_t* abs_qs = nullptr;
  const float* sum8 = nullptr;
  const int8_t* pairs = nullptr;
};

// The arrays behind a GgmlActivations (growing only).
struct GgmlActivationBuffers {
  std::vector<float> d, sum8;
  std::vector<int8_t> qs, pairs;
  std::vector<uint8_t> abs_qs;
  void fit(size_t stride, size_t n);  // room for n inputs of `stride` blocks
};

// Blocks per input in a GgmlActivations of `cols` columns: cols/32 rounded up to a multiple of 8.
size_t ggml_activation_stride(size_t cols);

// Rounds x (n rows of cols floats) into b, growing it only if it is too small.
GgmlActivations ggml_round_activations_into(GgmlActivationBuffers& b, const float* x, size_t cols, size_t n,
                                            bool avx2);

// The same into the calling thread's scratch, which grows only: after the widest call (or
// ggml_legacy_reserve_scratch) it never allocates. Valid until the thread's next call. `avx2`
// picks quantize_activations_avx2 (bit-identical, faster).
GgmlActivations ggml_round_activations(const float* x, size_t cols, size_t n, bool avx2);

// The AVX2/FMA kernels of the legacy family for t (ggml_legacy_avx2.cpp), null for types outside
// it. Only present in builds with MOESTREAM_AVX2_KERNELS; call only when avx2_usable().
GgmlMatvecFn ggml_legacy_matvec_avx2(GgmlType t);
GgmlRoundedMatvecFn ggml_legacy_rounded_matvec_avx2(GgmlType t);
GgmlMatmulFn ggml_legacy_matmul_avx2(GgmlType t);

}  // namespace moestream::detail
