// AVX2/FMA/F16C matvec kernels for the expert encodings; compiled with -mavx2 -mfma -mf16c and
// called only when the CPU has them (detail::avx2_usable). Same maths as matvec_scalar.
//
// Keep this file free of std:: templates and inline library functions: an instantiation compiled
// here with AVX2 could be the one the linker keeps for the whole program (ODR), and would then
// run on CPUs without AVX2.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream::detail {
namespace {

// Software prefetch this far ahead of the weights being read: the hardware prefetcher alone left
// streamed (not cached) q4 at ~7.6 GB/s on the 2-core dev VM, this gets ~10.6 (bench_quant_matvec).
// Prefetching past the matrix end is harmless (a hint, never a fault).
constexpr size_t kPrefetchBytes = 2048;

// 8 partial sums (as float) of 32 u8*i8 products: maddubs -> 16 x i16, madd with 1 -> 8 x i32.
// Pair sums stay below 2*127*127 < 2^15 (q8) and 2*15*127 (q4): no i16 saturation.
inline __m256 dot_u8_i8(__m256i u, __m256i s) {
  const __m256i s16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 32 nibbles of a q4 block as unsigned bytes 0..15 (the -8 bias is applied per block later).
inline __m256i load_nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);  // hi half: elements 16..31
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

float row_f32(const float* w, const float* x, size_t cols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  size_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(w + c) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + c) + kPrefetchBytes + 64, _MM_HINT_T0);
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
    _mm_prefetch(reinterpret_cast<const char*>(w + 2 * c) + kPrefetchBytes, _MM_HINT_T0);
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

// q8: w*x = |x| * (w with x's sign), so maddubs gets |x| (precomputed once per call) unsigned.
// Scales for 8 blocks are converted and multiplied at once and broadcast from memory (a load, not
// a shuffle); four accumulators hide the FMA latency.
float row_q8(const uint8_t* row, size_t nb, const QuantizedActivations& xa) {
  const auto* qs = reinterpret_cast<const __m256i*>(row + nb * 2);
  const auto* xq = reinterpret_cast<const __m256i*>(xa.qs);
  const auto* xabs = reinterpret_cast<const __m256i*>(xa.abs_qs);
  auto block = [&](size_t b) {
    const __m256i w = _mm256_sign_epi8(_mm256_loadu_si256(qs + b), _mm256_loadu_si256(xq + b));
    return dot_u8_i8(_mm256_loadu_si256(xabs + b), w);
  };
  // Named accumulators, fully unrolled: an array indexed in a loop ends up on the stack.
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  alignas(32) float s[8];
  size_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const char* ahead = reinterpret_cast<const char*>(qs + b) + kPrefetchBytes;
    for (int k = 0; k < 4; ++k) _mm_prefetch(ahead + 64 * k, _MM_HINT_T0);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * b));
    _mm256_store_ps(s, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xa.d + b)));
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 0), block(b + 0), a0);
    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 1), block(b + 1), a1);
    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 2), block(b + 2), a2);
    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 3), block(b + 3), a3);
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 4), block(b + 4), a0);
    a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 5), block(b + 5), a1);
    a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 6), block(b + 6), a2);
    a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(s + 7), block(b + 7), a3);
  }
  for (; b < nb; ++b) a0 = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(row + 2 * b) * xa.d[b]), block(b), a0);
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// q4: sum (n-8)*x = sum n*x - 8*sum x. maddubs takes the nibbles n (0..15) as the unsigned side
// directly; the bias term is one FMA per 8 blocks against the precomputed 8*sum(x) per block.
// Two blocks per step: one 32-byte load holds both blocks' nibbles; masking gives elements 0..15
// of both, shifting 16..31 of both, against x pre-arranged the same way (qs_pairs). After madd,
// lanes 0-3 belong to the first block and 4-7 to the second, scaled by one permuted vector.
float row_q4(const uint8_t* row, size_t nb, const QuantizedActivations& xa) {
  const uint8_t* qs = row + nb * 2;
  const auto* xq = reinterpret_cast<const __m256i*>(xa.qs);
  const auto* xp = reinterpret_cast<const __m256i*>(xa.qs_pairs);
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  auto pair = [&](size_t b) {  // blocks b, b+1 (b even)
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 16 * b));
    const __m256i lo = _mm256_and_si256(raw, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(xp + b)),
                                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xp + b + 1)));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));  // |i16| <= 4*15*127: no saturation
  };
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), idx1 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                idx2 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), idx3 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  __m256 bias = _mm256_setzero_ps();
  size_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(qs + 16 * b + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(qs + 16 * b + kPrefetchBytes + 64), _MM_HINT_T0);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * b));
    const __m256 sv = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(xa.d + b));
    bias = _mm256_fmadd_ps(sv, _mm256_loadu_ps(xa.sum8 + b), bias);
    a0 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, idx0), pair(b + 0), a0);
    a1 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, idx1), pair(b + 2), a1);
    a2 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, idx2), pair(b + 4), a2);
    a3 = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, idx3), pair(b + 6), a3);
  }
  float tail_bias = 0;
  for (; b + 2 <= nb; b += 2) {
    const float s0 = load_f16(row + 2 * b) * xa.d[b], s1 = load_f16(row + 2 * b + 2) * xa.d[b + 1];
    a0 = _mm256_fmadd_ps(_mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1), pair(b), a0);
    tail_bias += s0 * xa.sum8[b] + s1 * xa.sum8[b + 1];
  }
  if (b < nb) {  // odd last block: the single-block path
    const float sc = load_f16(row + 2 * b) * xa.d[b];
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(sc), dot_u8_i8(load_nibbles(qs + 16 * b), _mm256_loadu_si256(xq + b)), a0);
    tail_bias += sc * xa.sum8[b];
  }
  const __m256 total = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  return hsum(total) - hsum(bias) - tail_bias;
}

}  // namespace

void quantize_activations_avx2(const float* x, size_t cols, float* d, int8_t* qs, uint8_t* abs_qs,
                               float* sum8, int8_t* qs_pairs) {
  const size_t nb = (cols + kQuantBlock - 1) / kQuantBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  alignas(32) float padded[kQuantBlock];
  for (size_t b = 0; b < nb; ++b) {
    const float* src = x + b * kQuantBlock;
    if ((b + 1) * kQuantBlock > cols) {  // last, partial block: zero padded copy
      for (int i = 0; i < kQuantBlock; ++i) {
        size_t c = b * kQuantBlock + i;
        padded[i] = c < cols ? x[c] : 0.0f;
      }
      src = padded;
    }
    __m256 v0 = _mm256_loadu_ps(src), v1 = _mm256_loadu_ps(src + 8), v2 = _mm256_loadu_ps(src + 16),
           v3 = _mm256_loadu_ps(src + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    d[b] = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0 ? 127.0f / amax : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), kRound));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), kRound));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), kRound));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), kRound));
    // |x * 127/amax| <= 127 (+ rounding), so the saturating packs never clip; they interleave
    // 128-bit lanes, which the final permute undoes.
    const __m256i s01 = _mm256_packs_epi32(i0, i1), s23 = _mm256_packs_epi32(i2, i3);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(s01, s23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQuantBlock), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(abs_qs + b * kQuantBlock), _mm256_abs_epi8(q));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    sum8[b] = static_cast<float>(8 * _mm_cvtsi128_si32(s4));
  }
  for (size_t p = 0; p < nb / 2; ++p) {
    const int8_t* b0 = qs + 2 * p * kQuantBlock;
    const __m128i lo0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0));
    const __m128i hi0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 16));
    const __m128i lo1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 32));
    const __m128i hi1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 48));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs_pairs + p * 64), _mm256_set_m128i(lo1, lo0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs_pairs + p * 64 + 32), _mm256_set_m128i(hi1, hi0));
  }
}

void matvec_avx2(QuantType q, const uint8_t* w, size_t cols, const float* x,
                 const QuantizedActivations& xa, float* y, size_t row_begin, size_t row_end) {
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
      for (size_t r = row_begin; r < row_end; ++r) y[r] = row_q8(w + r * nb * 34, nb, xa);
      return;
    case QuantType::kQ4:
      for (size_t r = row_begin; r < row_end; ++r) y[r] = row_q4(w + r * nb * 18, nb, xa);
      return;
  }
}

}  // namespace moestream::detail
