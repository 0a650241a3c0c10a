// AVX2 products of NVFP4 (scalar reference: ggml_nvfp4.cpp); compiled with -mavx2 -mfma -mf16c
// -ffp-contract=off and called only when detail::avx2_usable(). The same exact int32 dots per
// sub-block of 16 as the scalar kernel, in 4 lanes each; only the float summation order differs.
//
// A block's 32 nibble bytes become two vectors of signed levels, one per 32-column input block:
// unpacking the low and high nibbles by 8-byte halves gives [sub-block 0 | 2] and [1 | 3], and a
// lane permute pairs them as the input blocks [0 | 1] and [2 | 3]. The product is IQ4_NL's: the
// input's sign moves onto the levels so maddubs gets |x| (<= 127) against |level| <= 12.
// Every (row, input) pair runs the same arithmetic whatever the number of inputs, so matmul equals
// matvec input by input.
//
// Keep this file free of std:: templates and inline library functions (see quant_avx2.cpp).
#include <immintrin.h>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/ggml_legacy_kernels.h"
#include "kernels/cpu/ggml_nvfp4_kernels.h"

namespace moestream::detail {
namespace {

constexpr size_t kInputBlock = 32;

inline void block_levels(const uint8_t* b, __m256i& first, __m256i& second) {
  const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,  //
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 4));
  const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  const __m256i s02 = _mm256_unpacklo_epi64(lo, hi), s13 = _mm256_unpackhi_epi64(lo, hi);
  first = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(s02, s13, 0x20));
  second = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(s02, s13, 0x31));
}

// The exact dot of 32 signed levels with input block xb, as 8 int32 lanes converted to float
// (lanes 0-3: the block's first sub-block, 4-7: its second).
inline __m256 block_dot(__m256i w, const GgmlActivations& a, size_t xb) {
  const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + xb * kInputBlock));
  const __m256i ax = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.abs_qs + xb * kInputBlock));
  const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xq));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// NI inputs (first input index in[i] * stride) of one row; out[i].
template <int NI>
inline __attribute__((always_inline)) void row_tile(const uint8_t* row, const GgmlActivations& a, const size_t* in,
                                                    float* out) {
  __m256 acc[NI];
#pragma GCC unroll 8
  for (int i = 0; i < NI; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i lanes01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i lanes23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  const size_t blocks = a.nb / 2;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * kNvfp4Bytes;
    __m256i w0, w1;
    block_levels(blk, w0, w1);
    const __m128 dw = _mm_setr_ps(kNvfp4HalfScales.v[blk[0]], kNvfp4HalfScales.v[blk[1]], kNvfp4HalfScales.v[blk[2]],
                                  kNvfp4HalfScales.v[blk[3]]);
    const __m256 dw01 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dw), lanes01);
    const __m256 dw23 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dw), lanes23);
#pragma GCC unroll 8
    for (int i = 0; i < NI; ++i) {
      const size_t xb = in[i] + 2 * b;
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw01, _mm256_broadcast_ss(a.d + xb)), block_dot(w0, a, xb), acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw23, _mm256_broadcast_ss(a.d + xb + 1)), block_dot(w1, a, xb + 1),
                               acc[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NI; ++i) out[i] = hsum(acc[i]);
}

}  // namespace

void nvfp4_rounded_rows_avx2(const uint8_t* w, const GgmlActivations& a, size_t first, size_t n, float* y,
                             size_t y_stride, size_t row_begin, size_t row_end) {
  const size_t row_bytes = a.nb / 2 * kNvfp4Bytes;
  for (size_t i0 = 0; i0 < n; i0 += 4) {
    const size_t ni = n - i0 < 4 ? n - i0 : 4;
    size_t in[4] = {};
    for (size_t j = 0; j < ni; ++j) in[j] = (first + i0 + j) * a.stride;
    for (size_t r = row_begin; r < row_end; ++r) {
      float out[4];
      const uint8_t* row = w + r * row_bytes;
      switch (ni) {
        case 4: row_tile<4>(row, a, in, out); break;
        case 3: row_tile<3>(row, a, in, out); break;
        case 2: row_tile<2>(row, a, in, out); break;
        default: row_tile<1>(row, a, in, out); break;
      }
      for (size_t j = 0; j < ni; ++j) y[(i0 + j) * y_stride + r] = out[j];
    }
  }
}

}  // namespace moestream::detail
