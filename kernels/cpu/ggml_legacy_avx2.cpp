// AVX2/FMA/F16C kernels of the legacy ggml family (scalar reference: ggml_legacy.cpp). Compiled
// with -mavx2 -mfma -mf16c -ffp-contract=off and called only when detail::avx2_usable().
//
// One tile routine per type computes NR rows x NI inputs; every (row, input) pair has its own
// accumulators and runs the same arithmetic in the same order whatever NR and NI are, so the
// matvec (block types: 1 row x 1 input; plain types: 4 rows x 1 input) and the matmul (1 row x 4
// inputs, each weight block decoded once) agree bit for bit, input by input.
//
// Keep this file free of std:: templates and inline library functions (see quant_avx2.cpp: an
// instantiation compiled here could be the one the linker keeps for CPUs without AVX2).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/ggml_legacy_kernels.h"

namespace moestream::detail {
namespace {

constexpr size_t kBlock = 32;
// Software prefetch distance of the block types' streamed weights (the hardware prefetcher alone
// left a Q8_0 matvec at ~60% of a bare load loop on the dev VM; 1-4 KiB ahead measured alike).
// The plain types' long rows stream as fast without (measured: their 4-row tiles ran slower
// with it).
constexpr size_t kPrefetchBytes = 2048;
// matmul: rows per chunk so that the chunk stays in L2 while every input tile passes over it.
constexpr size_t kChunkBytes = size_t{128} << 10;

inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

inline int u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// always_inline: a prefetch_span left out of line is a function without side effects to GCC
// (ipa-pure-const), and its calls were deleted: the kernels had no software prefetch at all.
inline __attribute__((always_inline)) void prefetch_span(const uint8_t* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

// The float16 at p + k * stride for k < cnt (0 past cnt) as 8 floats.
template <bool kFull>
inline __m256 f16_scales(const uint8_t* p, size_t stride, size_t cnt) {
  if constexpr (kFull) {
    __m128i h = _mm_cvtsi32_si128(u16_at(p));
    h = _mm_insert_epi16(h, u16_at(p + stride), 1);
    h = _mm_insert_epi16(h, u16_at(p + 2 * stride), 2);
    h = _mm_insert_epi16(h, u16_at(p + 3 * stride), 3);
    h = _mm_insert_epi16(h, u16_at(p + 4 * stride), 4);
    h = _mm_insert_epi16(h, u16_at(p + 5 * stride), 5);
    h = _mm_insert_epi16(h, u16_at(p + 6 * stride), 6);
    h = _mm_insert_epi16(h, u16_at(p + 7 * stride), 7);
    return _mm256_cvtph_ps(h);
  } else {
    alignas(16) uint16_t t[8] = {};
    for (size_t k = 0; k < cnt; ++k) t[k] = static_cast<uint16_t>(u16_at(p + k * stride));
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
}

// 32 elements of a 16-byte nibble run as bytes 0..15: low nibbles are elements 0..15.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
}

// Bit j of the 32-bit qh at p as 0x10 in byte j (bit 4 of the 5-bit level).
inline __m256i high_bits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// Two blocks' 16-byte nibble runs (at a and b) as unsigned bytes in the pair layout of
// GgmlActivations::pairs: lo = [a 0..15 | b 0..15], hi = [a 16..31 | b 16..31].
inline void nibble_pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) {
  const __m256i raw = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m256i mask = _mm256_set1_epi8(0x0f);
  lo = _mm256_and_si256(raw, mask);
  hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
}

// The 5th bits (qh at a and b) in the same pair layout, as 0x10 per byte.
inline void high_bit_pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) {
  uint32_t qa, qb;
  std::memcpy(&qa, a, 4);
  std::memcpy(&qb, b, 4);
  const __m256i v = _mm256_set_m128i(_mm_set1_epi32(static_cast<int>(qb)), _mm_set1_epi32(static_cast<int>(qa)));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL), five = _mm256_set1_epi8(0x10);
  const __m256i lo_idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1,
                                          1, 1, 1, 1, 1, 1);
  const __m256i hi_idx = _mm256_add_epi8(lo_idx, _mm256_set1_epi8(2));
  lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, lo_idx), bit), bit), five);
  hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, hi_idx), bit), bit), five);
}

// How a type's block dot is formed (all give the exact int32 dot in 8 lanes; maddubs pair sums
// must fit in int16):
// - kPaired: unsigned levels u (0..31) against the input in the pair layout, two blocks per
//   step (two maddubs added in int16: 2 * 2 * 31 * 127 < 2^15, then one madd). The value is
//   d * u + c per element, c = the min (Q4_1, Q5_1) or -bias * d (Q4_0: -8d, Q5_0: -16d,
//   MXFP4: -12d for levels shifted by +12); the c term is c * d_x * sum(x) per block, one FMA
//   per 8 blocks. An odd last block goes alone against the natural layout.
// - kSignedW: signed levels down to -128 (Q8_0): |w| unsigned, w's sign moved onto the input.
// - kSignedX: signed levels in [-127, 127] (IQ4_NL): |x| (precomputed) unsigned, x's sign on w.
enum class Dot { kPaired, kSignedW, kSignedX };

struct Q4_0 {
  static constexpr size_t kBytes = 18;
  static constexpr Dot kDot = Dot::kPaired;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t*, size_t, __m256 ws) {
    return _mm256_mul_ps(ws, _mm256_set1_ps(-8.0f));
  }
  static void pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) { nibble_pair(a + 2, b + 2, lo, hi); }
  static __m256i levels(const uint8_t* b) { return nibbles(b + 2); }
};
struct Q4_1 {
  static constexpr size_t kBytes = 20;
  static constexpr Dot kDot = Dot::kPaired;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t* p, size_t cnt, __m256) {
    return f16_scales<kFull>(p + 2, kBytes, cnt);
  }
  static void pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) { nibble_pair(a + 4, b + 4, lo, hi); }
  static __m256i levels(const uint8_t* b) { return nibbles(b + 4); }
};
struct Q5_0 {
  static constexpr size_t kBytes = 22;
  static constexpr Dot kDot = Dot::kPaired;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t*, size_t, __m256 ws) {
    return _mm256_mul_ps(ws, _mm256_set1_ps(-16.0f));
  }
  static void pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) {
    __m256i hl, hh;
    nibble_pair(a + 6, b + 6, lo, hi);
    high_bit_pair(a + 2, b + 2, hl, hh);
    lo = _mm256_or_si256(lo, hl);
    hi = _mm256_or_si256(hi, hh);
  }
  static __m256i levels(const uint8_t* b) { return _mm256_or_si256(nibbles(b + 6), high_bits(b + 2)); }
};
struct Q5_1 {
  static constexpr size_t kBytes = 24;
  static constexpr Dot kDot = Dot::kPaired;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t* p, size_t cnt, __m256) {
    return f16_scales<kFull>(p + 2, kBytes, cnt);
  }
  static void pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) {
    __m256i hl, hh;
    nibble_pair(a + 8, b + 8, lo, hi);
    high_bit_pair(a + 4, b + 4, hl, hh);
    lo = _mm256_or_si256(lo, hl);
    hi = _mm256_or_si256(hi, hh);
  }
  static __m256i levels(const uint8_t* b) { return _mm256_or_si256(nibbles(b + 8), high_bits(b + 4)); }
};
struct MXFP4 {
  static constexpr size_t kBytes = 17;
  static constexpr Dot kDot = Dot::kPaired;
  // E8M0 byte e as 2^(e-128) (half the scale; the levels are doubled E2M1 values).
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) {
    uint64_t e = 0;
    for (size_t k = 0; k < (kFull ? 8 : cnt); ++k) e |= uint64_t{p[k * kBytes]} << (8 * k);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(e)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
  }
  template <bool kFull> static __m256 offsets(const uint8_t*, size_t, __m256 ws) {
    return _mm256_mul_ps(ws, _mm256_set1_ps(-12.0f));
  }
  // Doubled E2M1 values + 12, so that they are unsigned (0..24).
  static __m256i table() {
    return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18, 20, 24,
                            12, 11, 10, 9, 8, 6, 4, 0);
  }
  static void pair(const uint8_t* a, const uint8_t* b, __m256i& lo, __m256i& hi) {
    nibble_pair(a + 1, b + 1, lo, hi);
    lo = _mm256_shuffle_epi8(table(), lo);
    hi = _mm256_shuffle_epi8(table(), hi);
  }
  static __m256i levels(const uint8_t* b) { return _mm256_shuffle_epi8(table(), nibbles(b + 1)); }
};
struct Q8_0 {
  static constexpr size_t kBytes = 34;
  static constexpr Dot kDot = Dot::kSignedW;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t*, size_t, __m256) { return _mm256_setzero_ps(); }
  static void pair(const uint8_t*, const uint8_t*, __m256i&, __m256i&) {}
  static __m256i levels(const uint8_t* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
};
struct IQ4_NL {
  static constexpr size_t kBytes = 18;
  static constexpr Dot kDot = Dot::kSignedX;
  template <bool kFull> static __m256 scales(const uint8_t* p, size_t cnt) { return f16_scales<kFull>(p, kBytes, cnt); }
  template <bool kFull> static __m256 offsets(const uint8_t*, size_t, __m256) { return _mm256_setzero_ps(); }
  static void pair(const uint8_t*, const uint8_t*, __m256i&, __m256i&) {}
  static __m256i levels(const uint8_t* b) {
    const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                           -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return _mm256_shuffle_epi8(table, nibbles(b + 2));
  }
};

// The lanes of a pair's scales in the paired layout: [s(2q) x4, s(2q+1) x4].
inline __m256i pair_lanes(int q) {
  return _mm256_setr_epi32(2 * q, 2 * q, 2 * q, 2 * q, 2 * q + 1, 2 * q + 1, 2 * q + 1, 2 * q + 1);
}

// One group of blocks [g, g + cnt), cnt <= 8 (8 when kFull: the loops then have constant bounds
// and unroll), of NR rows x NI inputs; see block_tile.
template <class T, int NR, int NI, bool kFull>
inline __attribute__((always_inline)) void block_group(const uint8_t* const* rows, const GgmlActivations& a,
                                                       const size_t* in, size_t g, size_t cnt_, size_t ahead,
                                                       __m256 (&acc)[NR][NI], __m256 (&macc)[NR][NI]) {
  constexpr bool kPaired = T::kDot == Dot::kPaired;
  const size_t cnt = kFull ? 8 : cnt_;
  const __m256i ones = _mm256_set1_epi16(1);
  // A block's scale reaches its 8 lanes by a register permute for one (row, input) pair; with
  // several inputs the permutes would outnumber the loads, so the scales go through memory and
  // come back as broadcast loads. Either way the same float multiplies the same dot.
  constexpr bool kViaMemory = NR * NI > 1;
  __m256 sv[NR][NI];  // d_w * d_x of the group's blocks
  constexpr int kM = kViaMemory ? 1 : 0;  // the memory copies' extent: none without kViaMemory
  alignas(32) float sm[kM * NR + 1 - kM][kM * NI + 1 - kM][8];
  alignas(32) float sm2[kPaired ? kM * NR + 1 - kM : 1][kPaired ? kM * NI + 1 - kM : 1][4][8];  // pair q's lanes
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r) {
    const uint8_t* p = rows[r] + g * T::kBytes;
    prefetch_span(p + ahead, 8 * T::kBytes);
    const __m256 ws = T::template scales<kFull>(p, cnt);
    __m256 wc = _mm256_setzero_ps();
    if constexpr (kPaired) wc = T::template offsets<kFull>(p, cnt, ws);
#pragma GCC unroll 16
    for (int i = 0; i < NI; ++i) {
      const __m256 xd = _mm256_loadu_ps(a.d + in[i] + g);
      sv[r][i] = _mm256_mul_ps(ws, xd);
      if constexpr (kViaMemory) {
        _mm256_store_ps(sm[r][i], sv[r][i]);
        if constexpr (kPaired)
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) _mm256_store_ps(sm2[r][i][q], _mm256_permutevar8x32_ps(sv[r][i], pair_lanes(q)));
      }
      if constexpr (kPaired) {
        const __m256 xsum = _mm256_mul_ps(_mm256_loadu_ps(a.sum8 + in[i] + g), _mm256_set1_ps(0.125f));
        macc[r][i] = _mm256_fmadd_ps(_mm256_mul_ps(wc, xd), xsum, macc[r][i]);
      }
    }
  }
  size_t k = 0;
  if constexpr (kPaired) {
#pragma GCC unroll 4
    for (; k + 2 <= cnt; k += 2) {
      const __m256i lanes = pair_lanes(int(k / 2));
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        __m256i lo, hi;
        T::pair(rows[r] + (g + k) * T::kBytes, rows[r] + (g + k + 1) * T::kBytes, lo, hi);
#pragma GCC unroll 16
        for (int i = 0; i < NI; ++i) {
          const int8_t* xp = a.pairs + (in[i] + g + k) * kBlock;
          const __m256i p16 =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp))),
                               _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32))));
          const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
          const __m256 sc = kViaMemory ? _mm256_load_ps(sm2[r][i][k / 2]) : _mm256_permutevar8x32_ps(sv[r][i], lanes);
          acc[r][i] = _mm256_fmadd_ps(sc, dot, acc[r][i]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (; k < cnt; ++k) {  // all blocks of the signed types; an odd last block of the paired ones
    const __m256i lane = _mm256_set1_epi32(int(k));
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) {
      const __m256i w = T::levels(rows[r] + (g + k) * T::kBytes);
      const __m256i aw = T::kDot == Dot::kSignedW ? _mm256_abs_epi8(w) : w;
#pragma GCC unroll 16
      for (int i = 0; i < NI; ++i) {
        const size_t xb = (in[i] + g + k) * kBlock;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + xb));
        __m256i p16;
        if constexpr (T::kDot == Dot::kSignedW) {
          p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, w));
        } else if constexpr (T::kDot == Dot::kSignedX) {
          p16 = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.abs_qs + xb)),
                                     _mm256_sign_epi8(w, xq));
        } else {
          p16 = _mm256_maddubs_epi16(w, xq);
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        const __m256 sc = kViaMemory ? _mm256_broadcast_ss(&sm[r][i][k]) : _mm256_permutevar8x32_ps(sv[r][i], lane);
        acc[r][i] = _mm256_fmadd_ps(sc, dot, acc[r][i]);
      }
    }
  }
}

// NR rows x NI inputs of a block type; out[r * NI + i]. Input i's blocks start at in[i]. Per block
// (or pair of blocks) and (row, input): the exact int32 dot in 8 lanes, converted and FMA'd with
// d_w*d_x into that pair's accumulator; the paired types' c term goes to a second accumulator.
// Blocks are taken 8 at a time so that their scales convert in one instruction; the last group
// runs with zero scales past nb (the activation padding is zero too). A block's scale reaches the
// 8 lanes by a register permute, not through memory: a store and reload per group tied each
// group's loads to the previous stores and kept streamed weights from overlapping with the
// arithmetic. The weights `ahead` bytes past each row's current group are prefetched.
template <class T, int NR, int NI>
inline __attribute__((always_inline)) void block_tile(const uint8_t* const* rows, const GgmlActivations& a,
                                                      const size_t* in, float* out, size_t ahead) {
  // Plain loops over NR and NI with constant bounds, no lambdas: GCC then keeps acc in registers.
  constexpr bool kPaired = T::kDot == Dot::kPaired;
  __m256 acc[NR][NI], macc[NR][NI];
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
    for (int i = 0; i < NI; ++i) acc[r][i] = macc[r][i] = _mm256_setzero_ps();
  const size_t full = a.nb / 8 * 8;
  for (size_t g = 0; g < full; g += 8) block_group<T, NR, NI, true>(rows, a, in, g, 8, ahead, acc, macc);
  if (full < a.nb) block_group<T, NR, NI, false>(rows, a, in, full, a.nb - full, ahead, acc, macc);
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 16
    for (int i = 0; i < NI; ++i) {
      float v = hsum(acc[r][i]);
      if constexpr (kPaired) v += hsum(macc[r][i]);
      out[r * NI + i] = v;
    }
}

// One row at a time, front to back: the weights are read as one sequential stream, prefetched
// kPrefetchBytes ahead. Measured on the dev VM (Zen 3, Q8_0 2048 and 768 wide, 256 MiB streamed):
// 1.2-1.6x the 4-row tiles, which read four streams a row apart, and 0.9-1.0x of a bare load loop.
template <class T>
void rounded_matvec(const uint8_t* w, const GgmlActivations& a, size_t input, float* y, size_t row_begin,
                    size_t row_end) {
  const size_t row_bytes = a.nb * T::kBytes, in[1] = {input * a.stride};
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* rows[1] = {w + r * row_bytes};
    block_tile<T, 1, 1>(rows, a, in, y + r, kPrefetchBytes);
  }
}

template <class T>
void matvec_blocks(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin, size_t row_end) {
  if (row_begin >= row_end) return;
  rounded_matvec<T>(w, ggml_round_activations(x, cols, 1, true), 0, y, row_begin, row_end);
}

template <class T>
void matmul_blocks(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride,
                   size_t row_begin, size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const GgmlActivations a = ggml_round_activations(x, cols, n, true);
  const size_t row_bytes = a.nb * T::kBytes;
  const size_t chunk_rows = row_bytes >= kChunkBytes ? 1 : kChunkBytes / row_bytes;
  for (size_t r0 = row_begin; r0 < row_end; r0 += chunk_rows) {
    const size_t r1 = min_size(row_end, r0 + chunk_rows);
    for (size_t i0 = 0; i0 < n; i0 += 4) {
      const size_t ni = min_size(4, n - i0);
      size_t in[4] = {};
      for (size_t j = 0; j < ni; ++j) in[j] = (i0 + j) * a.stride;
      for (size_t r = r0; r < r1; ++r) {
        const uint8_t* rows[1] = {w + r * row_bytes};
        float out[4];
        switch (ni) {
          case 4: block_tile<T, 1, 4>(rows, a, in, out, row_bytes); break;
          case 3: block_tile<T, 1, 3>(rows, a, in, out, row_bytes); break;
          case 2: block_tile<T, 1, 2>(rows, a, in, out, row_bytes); break;
          default: block_tile<T, 1, 1>(rows, a, in, out, row_bytes); break;
        }
        for (size_t j = 0; j < ni; ++j) y[(i0 + j) * y_stride + r] = out[j];
      }
    }
  }
}

// The plain types: 8 weights widened to float per step, FMA'd with the float input.
struct F32 {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* row, size_t c) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c); }
  static float load1(const uint8_t* row, size_t c) {
    float f;
    std::memcpy(&f, row + 4 * c, 4);
    return f;
  }
};
struct F16 {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* row, size_t c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
  }
  static float load1(const uint8_t* row, size_t c) { return _cvtsh_ss(static_cast<uint16_t>(u16_at(row + 2 * c))); }
};
struct BF16 {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* row, size_t c) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float load1(const uint8_t* row, size_t c) {
    const uint32_t u = static_cast<uint32_t>(u16_at(row + 2 * c)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// NR rows x NI inputs of a plain type, one accumulator per pair, columns past the last multiple
// of 8 added one by one after the horizontal sum.
template <class T, int NR, int NI>
inline __attribute__((always_inline)) void plain_tile(const uint8_t* const* rows, size_t cols, const float* const* x,
                                                      float* out) {
  __m256 acc[NR][NI];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < NI; ++i) acc[r][i] = _mm256_setzero_ps();
  auto step = [&](size_t c) {
    __m256 xv[NI];
    for (int i = 0; i < NI; ++i) xv[i] = _mm256_loadu_ps(x[i] + c);
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = T::load8(rows[r], c);
      for (int i = 0; i < NI; ++i) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  };
  size_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    step(c);
    step(c + 8);
    step(c + 16);
    step(c + 24);
  }
  for (; c + 8 <= cols; c += 8) step(c);
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < NI; ++i) {
      float v = hsum(acc[r][i]);
      for (size_t t = c; t < cols; ++t) v += T::load1(rows[r], t) * x[i][t];
      out[r * NI + i] = v;
    }
}

template <class T>
void matvec_plain(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin, size_t row_end) {
  const size_t row_bytes = cols * T::kBytes;
  const float* xs[1] = {x};
  size_t r = row_begin;
  for (; r + 4 <= row_end; r += 4) {
    const uint8_t* rows[4] = {w + r * row_bytes, w + (r + 1) * row_bytes, w + (r + 2) * row_bytes,
                              w + (r + 3) * row_bytes};
    plain_tile<T, 4, 1>(rows, cols, xs, y + r);
  }
  for (; r < row_end; ++r) {
    const uint8_t* rows[1] = {w + r * row_bytes};
    plain_tile<T, 1, 1>(rows, cols, xs, y + r);
  }
}

template <class T>
void matmul_plain(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const size_t row_bytes = cols * T::kBytes;
  const size_t chunk_rows = row_bytes == 0 || row_bytes >= kChunkBytes ? 1 : kChunkBytes / row_bytes;
  for (size_t r0 = row_begin; r0 < row_end; r0 += chunk_rows) {
    const size_t r1 = min_size(row_end, r0 + chunk_rows);
    for (size_t i0 = 0; i0 < n; i0 += 4) {
      const size_t ni = min_size(4, n - i0);
      const float* xs[4] = {};
      for (size_t j = 0; j < ni; ++j) xs[j] = x + (i0 + j) * cols;
      for (size_t r = r0; r < r1; ++r) {
        const uint8_t* rows[1] = {w + r * row_bytes};
        float out[4];
        switch (ni) {
          case 4: plain_tile<T, 1, 4>(rows, cols, xs, out); break;
          case 3: plain_tile<T, 1, 3>(rows, cols, xs, out); break;
          case 2: plain_tile<T, 1, 2>(rows, cols, xs, out); break;
          default: plain_tile<T, 1, 1>(rows, cols, xs, out); break;
        }
        for (size_t j = 0; j < ni; ++j) y[(i0 + j) * y_stride + r] = out[j];
      }
    }
  }
}

}  // namespace

GgmlMatvecFn ggml_legacy_matvec_avx2(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return matvec_plain<F32>;
    case GgmlType::kF16: return matvec_plain<F16>;
    case GgmlType::kBF16: return matvec_plain<BF16>;
    case GgmlType::kQ4_0: return matvec_blocks<Q4_0>;
    case GgmlType::kQ4_1: return matvec_blocks<Q4_1>;
    case GgmlType::kQ5_0: return matvec_blocks<Q5_0>;
    case GgmlType::kQ5_1: return matvec_blocks<Q5_1>;
    case GgmlType::kQ8_0: return matvec_blocks<Q8_0>;
    case GgmlType::kIQ4_NL: return matvec_blocks<IQ4_NL>;
    case GgmlType::kMXFP4: return matvec_blocks<MXFP4>;
    default: return nullptr;
  }
}

GgmlRoundedMatvecFn ggml_legacy_rounded_matvec_avx2(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0: return rounded_matvec<Q4_0>;
    case GgmlType::kQ4_1: return rounded_matvec<Q4_1>;
    case GgmlType::kQ5_0: return rounded_matvec<Q5_0>;
    case GgmlType::kQ5_1: return rounded_matvec<Q5_1>;
    case GgmlType::kQ8_0: return rounded_matvec<Q8_0>;
    case GgmlType::kIQ4_NL: return rounded_matvec<IQ4_NL>;
    case GgmlType::kMXFP4: return rounded_matvec<MXFP4>;
    default: return nullptr;  // the plain types take float input
  }
}

GgmlMatmulFn ggml_legacy_matmul_avx2(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return matmul_plain<F32>;
    case GgmlType::kF16: return matmul_plain<F16>;
    case GgmlType::kBF16: return matmul_plain<BF16>;
    case GgmlType::kQ4_0: return matmul_blocks<Q4_0>;
    case GgmlType::kQ4_1: return matmul_blocks<Q4_1>;
    case GgmlType::kQ5_0: return matmul_blocks<Q5_0>;
    case GgmlType::kQ5_1: return matmul_blocks<Q5_1>;
    case GgmlType::kQ8_0: return matmul_blocks<Q8_0>;
    case GgmlType::kIQ4_NL: return matmul_blocks<IQ4_NL>;
    case GgmlType::kMXFP4: return matmul_blocks<MXFP4>;
    default: return nullptr;
  }
}

}  // namespace moestream::detail
