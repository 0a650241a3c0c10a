// Internal to the AVX2 super-block kernels (ggml_kquants_avx2.cpp, ggml_iquants_avx2.cpp; compiled
// with -mavx2 -mfma -mf16c only): vector helpers and the row loop over decoded super-blocks.
//
// A block type B decodes one super-block in load(), then dot(xq, bsums) gives its 8 int32 partial
// sums against one rounded input; d(), dmin() and mins() give the float factors and the minimums
// (per 16 columns, as madd factors for the activation sums) when B::kMin.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/ggml_kquants_kernels.h"

namespace moestream::detail::avx2 {

// Prefetch distance for streamed weights: far enough ahead to hide DRAM latency at one
// super-block per ~30 cycles, near enough to stay within the row group being read.
constexpr size_t kPrefetchBytes = 1024;

// Rows of a matmul tile: a tile's weights (16 rows of 4096 Q6_K columns = 53 KiB) stay in L2
// while each group of 4 inputs (4 KiB of int8 per 1024 columns) stays in L1.
constexpr size_t kRowTile = 16;

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256i mask8(int m) { return _mm256_set1_epi8(static_cast<char>(m)); }

// Word j of each 128-bit lane of v, in every word of that lane.
inline __m256i word_of(__m256i v, int j) { return _mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<short>(((2 * j + 1) << 8) | (2 * j)))); }
// Word j of v's lanes in the low lane, word j + 1 in the high lane (scales per 16 columns).
inline __m256i word_pair(__m256i v, int j) {
  const __m128i lo = _mm_set1_epi16(static_cast<short>(((2 * j + 1) << 8) | (2 * j)));
  const __m128i hi = _mm_set1_epi16(static_cast<short>(((2 * j + 3) << 8) | (2 * j + 2)));
  return _mm256_shuffle_epi8(v, _mm256_set_m128i(hi, lo));
}

// 16 words (one per 16 columns) -> 8 madd factors for the 8 vectors of 32 columns.
inline void pair_scales(__m256i w16, __m256i* sc) {
  const __m256i a = _mm256_permute2x128_si256(w16, w16, 0x00);  // words 0-7 in both lanes
  const __m256i b = _mm256_permute2x128_si256(w16, w16, 0x11);  // words 8-15
  for (int v = 0; v < 4; ++v) {
    sc[v] = word_pair(a, 2 * v);
    sc[v + 4] = word_pair(b, 2 * v);
  }
}

inline __m256i dot8(const __m256i* u, const __m256i* sc, const int8_t* xq) {
  __m256i s = _mm256_setzero_si256();
  for (int v = 0; v < 8; ++v) {
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u[v], loadu(xq + 32 * v)), sc[v]));
  }
  return s;
}

// Signed weights w (|w| = aw) against int8 inputs: the sign moves onto x so maddubs gets |w|.
inline __m256i signed_dot8(const __m256i* w, const __m256i* aw, const __m256i* sc, const int8_t* xq) {
  __m256i s = _mm256_setzero_si256();
  for (int v = 0; v < 8; ++v) {
    const __m256i sx = _mm256_sign_epi8(loadu(xq + 32 * v), w[v]);
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[v], sx), sc[v]));
  }
  return s;
}

// Rows [r0, r1) against inputs [i0, i0 + NI): each super-block decoded once for the NI inputs.
template <class B, int NI>
void rows_ni(const uint8_t* w, size_t nb, const KActivations& xa, size_t i0, float* y, size_t y_stride,
             size_t r0, size_t r1) {
  for (size_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * nb * B::kBytes;
    __m256 acc[NI];
    for (int i = 0; i < NI; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* blk = row + b * B::kBytes;
      for (size_t o = 0; o < B::kBytes; o += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes + o, _MM_HINT_T0);
      }
      B wb;
      wb.load(blk);
      for (int i = 0; i < NI; ++i) {
        const size_t xb = (i0 + i) * nb + b;
        const int16_t* bsums = xa.bsums + xb * 16;
        const __m256i isum = wb.dot(xa.qs + xb * kSuperBlock, bsums);
        const float dx = xa.d[xb];
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dx * wb.d()), _mm256_cvtepi32_ps(isum), acc[i]);
        if constexpr (B::kMin) {
          const __m256i msum = _mm256_madd_epi16(loadu(bsums), wb.mins());
          acc[i] = _mm256_fnmadd_ps(_mm256_set1_ps(dx * wb.dmin()), _mm256_cvtepi32_ps(msum), acc[i]);
        }
      }
    }
    for (int i = 0; i < NI; ++i) y[(i0 + i) * y_stride + r] = hsum(acc[i]);
  }
}

template <class B>
void rows(const uint8_t* w, size_t cols, const KActivations& xa, size_t n, float* y, size_t y_stride,
          size_t row_begin, size_t row_end) {
  const size_t nb = cols / kSuperBlock;
  if (n == 1) {
    rows_ni<B, 1>(w, nb, xa, 0, y, y_stride, row_begin, row_end);
    return;
  }
  for (size_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
    const size_t r1 = row_end - r0 < kRowTile ? row_end : r0 + kRowTile;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) rows_ni<B, 4>(w, nb, xa, i, y, y_stride, r0, r1);
    switch (n - i) {
      case 3: rows_ni<B, 3>(w, nb, xa, i, y, y_stride, r0, r1); break;
      case 2: rows_ni<B, 2>(w, nb, xa, i, y, y_stride, r0, r1); break;
      case 1: rows_ni<B, 1>(w, nb, xa, i, y, y_stride, r0, r1); break;
      default: break;
    }
  }
}

}  // namespace moestream::detail::avx2
