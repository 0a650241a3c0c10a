// Internal to the AVX2 kernel files of kernels/cpu (compiled with -mavx2 -mfma -mf16c only):
// helpers they all use.
#pragma once

#include <immintrin.h>

namespace moestream::detail {

// The sum of the 8 lanes.
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace moestream::detail
