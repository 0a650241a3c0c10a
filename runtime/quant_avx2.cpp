// AVX2/FMA/F16C matvec kernels for the expert encodings; compiled with -mavx2 -mfma -mf16c and
// called only when the CPU has them (detail::avx2_usable). Same maths as matvec_scalar.
//
// Keep this file free of std:: templates and inline library functions: an instantiation compiled
// here with AVX2 could be the one the linker keeps for the whole program (ODR), and would then
// run on CPUs without AVX2.
#include <immintrin.h>

#include <cstring>

#include "runtime/quant_kernels.h"

namespace moestream::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 partial sums of x*w over 32 int8 pairs, as float. x = activations in [-127, 127], w = weights
// in [-127, 127] (q8) or [-8, 7] (q4). maddubs multiplies unsigned by signed, so move x's sign
// onto w; pair sums stay below 2*127*127 < 2^15, so the i16 saturation never triggers.
inline __m256 dot_i8(__m256i x, __m256i w) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sw = _mm256_sign_epi8(w, x);
  const __m256i s16 = _mm256_maddubs_epi16(ax, sw);
  const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(s32);
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i load_q4(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, m);                     // elements 0..15
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);  // elements 16..31
  return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

float row_f32(const float* w, const float* x, size_t cols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  size_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
  }
  for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(x + c), a0);
  float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; c < cols; ++c) acc += w[c] * x[c];
  return acc;
}

inline __m256 load_bf16x8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

float row_bf16(const uint8_t* w, const float* x, size_t cols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  size_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    a0 = _mm256_fmadd_ps(load_bf16x8(w + 2 * c), _mm256_loadu_ps(x + c), a0);
    a1 = _mm256_fmadd_ps(load_bf16x8(w + 2 * c + 16), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(load_bf16x8(w + 2 * c + 32), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(load_bf16x8(w + 2 * c + 48), _mm256_loadu_ps(x + c + 24), a3);
  }
  for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(load_bf16x8(w + 2 * c), _mm256_loadu_ps(x + c), a0);
  float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; c < cols; ++c) {
    uint32_t u = uint32_t{static_cast<uint16_t>(w[2 * c] | (w[2 * c + 1] << 8))} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    acc += f * x[c];
  }
  return acc;
}

// Two accumulators: consecutive blocks' FMAs do not wait on each other.
float row_q8(const uint8_t* row, size_t nb, const float* xd, const int8_t* xqs) {
  const auto* qs = reinterpret_cast<const __m256i*>(row + nb * 2);
  const auto* xq = reinterpret_cast<const __m256i*>(xqs);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m256 p0 = dot_i8(_mm256_loadu_si256(xq + b), _mm256_loadu_si256(qs + b));
    const __m256 p1 = dot_i8(_mm256_loadu_si256(xq + b + 1), _mm256_loadu_si256(qs + b + 1));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b) * xd[b]), p0, a0);
    a1 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b + 2) * xd[b + 1]), p1, a1);
  }
  if (b < nb) {
    const __m256 p0 = dot_i8(_mm256_loadu_si256(xq + b), _mm256_loadu_si256(qs + b));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b) * xd[b]), p0, a0);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

float row_q4(const uint8_t* row, size_t nb, const float* xd, const int8_t* xqs) {
  const uint8_t* qs = row + nb * 2;
  const auto* xq = reinterpret_cast<const __m256i*>(xqs);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m256 p0 = dot_i8(_mm256_loadu_si256(xq + b), load_q4(qs + 16 * b));
    const __m256 p1 = dot_i8(_mm256_loadu_si256(xq + b + 1), load_q4(qs + 16 * b + 16));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b) * xd[b]), p0, a0);
    a1 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b + 2) * xd[b + 1]), p1, a1);
  }
  if (b < nb) {
    const __m256 p0 = dot_i8(_mm256_loadu_si256(xq + b), load_q4(qs + 16 * b));
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b) * xd[b]), p0, a0);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

}  // namespace

void matvec_avx2(QuantType q, const uint8_t* w, size_t cols, const float* x, const float* xd,
                 const int8_t* xqs, float* y, size_t row_begin, size_t row_end) {
  const size_t nb = (cols + kQuantBlock - 1) / kQuantBlock;
  switch (q) {
    case QuantType::kF32:
      for (size_t r = row_begin; r < row_end; ++r)
        y[r] = row_f32(reinterpret_cast<const float*>(w) + r * cols, x, cols);
      return;
    case QuantType::kBF16:
      for (size_t r = row_begin; r < row_end; ++r) y[r] = row_bf16(w + 2 * r * cols, x, cols);
      return;
    case QuantType::kQ8:
      for (size_t r = row_begin; r < row_end; ++r) y[r] = row_q8(w + r * nb * 34, nb, xd, xqs);
      return;
    case QuantType::kQ4:
      for (size_t r = row_begin; r < row_end; ++r) y[r] = row_q4(w + r * nb * 18, nb, xd, xqs);
      return;
  }
}

}  // namespace moestream::detail
