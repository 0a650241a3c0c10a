// AVX2 products of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and
// the ternary types (TQ1_0, TQ2_0); compiled with -mavx2 -mfma -mf16c and called only when
// detail::avx2_usable(). Same integer sums per super-block as kquant_rows_scalar on the decoders
// of ggml_iquants.cpp; only the float summation order differs.
//
// Each 32-column group becomes one vector of signed levels w and its magnitudes |w|: the grid
// entries of its 4 (IQ2, IQ1) or 8 (IQ3) indices side by side, signs applied with sign_epi8 from
// the group's 4 sign bytes or a table of their +-1 per column (IQ1: 8·grid ± 1). The product is IQ4_XS's: the sign moves onto x so
// maddubs gets |w| (<= 62) and the scales 2s + 1 (<= 31) are madd factors.
//
// Keep this file free of std:: templates and inline library functions (see quant_avx2.cpp).
#include <immintrin.h>

#include <cstring>

#include "loader/format/ggml_iq1_grid.h"
#include "loader/format/ggml_iq2_iq3_grids.h"
#include "kernels/cpu/ggml_kquants_avx2.h"

namespace moestream::detail {
namespace {

using namespace avx2;

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// +1 or -1 per column of a 32-column group from its 4 sign bytes (byte l, bit j: column 8l + j).
inline __m256i sign_of(uint32_t signs) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bits = _mm256_set1_epi64x(0x8040201008040201ll);
  const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(signs)), spread);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits);  // 0xff where negative
  return _mm256_or_si256(set, mask8(1));
}

// The same for signs given as 7-bit indices into kIqSigns (IQ2_XXS, IQ2_XS, IQ3_XXS): each index's
// 8 multipliers come from a table (1.2x the shuffle above there; slower for the raw bytes).
struct IndexSigns {
  uint64_t of[128];  // byte j: 0xff (-1) where bit j of kIqSigns[i] is set, else 0x01
};
constexpr IndexSigns make_index_signs() {
  IndexSigns t{};
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 8; ++j) t.of[i] |= uint64_t{((kIqSigns[i] >> j) & 1) ? 0xffu : 0x01u} << (8 * j);
  return t;
}
alignas(64) constexpr IndexSigns kIndexSigns = make_index_signs();

inline __m256i sign_of_indices(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
  return _mm256_set_epi64x(static_cast<long long>(kIndexSigns.of[i3]), static_cast<long long>(kIndexSigns.of[i2]),
                           static_cast<long long>(kIndexSigns.of[i1]), static_cast<long long>(kIndexSigns.of[i0]));
}
// Four 7-bit indices in bits 0-27 of aux.
inline __m256i sign_of_indices(uint32_t aux) {
  return sign_of_indices(aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127);
}

inline __m256i grid8(const uint64_t* grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
  return _mm256_set_epi64x(static_cast<long long>(grid[i3]), static_cast<long long>(grid[i2]),
                           static_cast<long long>(grid[i1]), static_cast<long long>(grid[i0]));
}

inline __m256i grid4(const uint32_t* grid, const uint32_t* idx) {
  return _mm256_setr_epi32(static_cast<int>(grid[idx[0]]), static_cast<int>(grid[idx[1]]),
                           static_cast<int>(grid[idx[2]]), static_cast<int>(grid[idx[3]]),
                           static_cast<int>(grid[idx[4]]), static_cast<int>(grid[idx[5]]),
                           static_cast<int>(grid[idx[6]]), static_cast<int>(grid[idx[7]]));
}

// One scale for the whole group, or one per 16 columns (low lane, high lane), as madd factors.
inline __m256i scale32(uint32_t s) { return _mm256_set1_epi16(static_cast<short>(2 * s + 1)); }
inline __m256i scale16(uint32_t lo, uint32_t hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(2 * hi + 1)), _mm_set1_epi16(static_cast<short>(2 * lo + 1)));
}

// What every type here yields: signed levels, their magnitudes, scales and d.
struct SignedBlock {
  static constexpr bool kMin = false;
  float d_;
  __m256i w[8], aw[8], sc[8];
  void set_unsigned(int g, __m256i magnitude, __m256i sign) {
    aw[g] = magnitude;
    w[g] = _mm256_sign_epi8(magnitude, sign);
  }
  void set_signed(int g, __m256i q) {
    w[g] = q;
    aw[g] = _mm256_abs_epi8(q);
  }
  float d() const { return d_; }
  float dmin() const { return 0.0f; }
  __m256i mins() const { return _mm256_setzero_si256(); }
  __m256i dot(const int8_t* xq, const int16_t*) const { return signed_dot8(w, aw, sc, xq); }
};

struct Iq2Xxs : SignedBlock {
  static constexpr size_t kBytes = 66;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      const uint8_t* p = b + 2 + 8 * g;
      const uint32_t aux = u32_at(p + 4);
      set_unsigned(g, grid8(kIq2xxsGrid.v, p[0], p[1], p[2], p[3]), sign_of_indices(aux));
      sc[g] = scale32(aux >> 28);
    }
    d_ = load_f16(b) * 0.125f;
  }
};

struct Iq2Xs : SignedBlock {
  static constexpr size_t kBytes = 74;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      uint16_t v[4];
      std::memcpy(v, b + 2 + 8 * g, 8);
      set_unsigned(g, grid8(kIq2xsGrid.v, v[0] & 511u, v[1] & 511u, v[2] & 511u, v[3] & 511u),
                   sign_of_indices(v[0] >> 9, v[1] >> 9, v[2] >> 9, v[3] >> 9));
      sc[g] = scale16(b[66 + g] & 0xfu, b[66 + g] >> 4);
    }
    d_ = load_f16(b) * 0.125f;
  }
};

struct Iq2S : SignedBlock {
  static constexpr size_t kBytes = 82;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      const uint8_t* qs = b + 2 + 4 * g;
      const uint32_t h = b[66 + g];
      set_unsigned(g,
                   grid8(kIq2sGrid.v, qs[0] | (h & 3u) << 8, qs[1] | (h >> 2 & 3u) << 8, qs[2] | (h >> 4 & 3u) << 8,
                         qs[3] | (h >> 6) << 8),
                   sign_of(u32_at(b + 34 + 4 * g)));
      sc[g] = scale16(b[74 + g] & 0xfu, b[74 + g] >> 4);
    }
    d_ = load_f16(b) * 0.125f;
  }
};

struct Iq3Xxs : SignedBlock {
  static constexpr size_t kBytes = 98;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      uint32_t idx[8];
      for (int m = 0; m < 8; ++m) idx[m] = b[2 + 8 * g + m];
      const uint32_t aux = u32_at(b + 66 + 4 * g);
      set_unsigned(g, grid4(kIq3xxsGrid.v, idx), sign_of_indices(aux));
      sc[g] = scale32(aux >> 28);
    }
    d_ = load_f16(b) * 0.25f;
  }
};

struct Iq3S : SignedBlock {
  static constexpr size_t kBytes = 110;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      uint32_t idx[8];
      for (int m = 0; m < 8; ++m) idx[m] = b[2 + 8 * g + m] | ((b[66 + g] >> m) & 1u) << 8;
      set_unsigned(g, grid4(kIq3sGrid.v, idx), sign_of(u32_at(b + 74 + 4 * g)));
      sc[g] = scale32((b[106 + g / 2] >> (4 * (g % 2))) & 0xfu);
    }
    d_ = load_f16(b);
  }
};

// IQ1: 8·grid + delta, delta = +-1 per 8 columns.
inline __m256i iq1_levels(__m256i grid, __m256i delta) { return _mm256_add_epi8(_mm256_sign_epi8(mask8(8), grid), delta); }

// IQ1_M's deltas of a 32-column group from their 4 sign bits (bit l: columns 8l..8l+7 get -1).
struct Iq1Deltas {
  alignas(32) int8_t of[16][32];
};
constexpr Iq1Deltas make_iq1_deltas() {
  Iq1Deltas t{};
  for (int m = 0; m < 16; ++m)
    for (int c = 0; c < 32; ++c) t.of[m][c] = ((m >> (c / 8)) & 1) ? -1 : 1;
  return t;
}
constexpr Iq1Deltas kIq1Deltas = make_iq1_deltas();

struct Iq1S : SignedBlock {
  static constexpr size_t kBytes = 50;
  void load(const uint8_t* b) {
    for (int g = 0; g < 8; ++g) {
      const uint32_t h = u16_at(b + 34 + 2 * g);
      const uint8_t* qs = b + 2 + 4 * g;
      const __m256i delta = mask8((h & 0x8000) ? -1 : 1);
      const __m256i grid = grid8(kIq1sGrid.v, qs[0] | (h & 7u) << 8, qs[1] | (h >> 3 & 7u) << 8, qs[2] | (h >> 6 & 7u) << 8,
                                 qs[3] | (h >> 9 & 7u) << 8);
      set_signed(g, iq1_levels(grid, delta));
      sc[g] = scale32((h >> 12) & 7);
    }
    d_ = load_f16(b) * 0.125f;
  }
};

struct Iq1M : SignedBlock {
  static constexpr size_t kBytes = 56;
  void load(const uint8_t* b) {
    uint16_t s[4];
    std::memcpy(s, b + 48, 8);
    for (int g = 0; g < 8; ++g) {
      const uint32_t h = uint32_t{b[32 + 2 * g]} | uint32_t{b[33 + 2 * g]} << 8;  // 4 nibbles, one per 8 columns
      const uint8_t* qs = b + 4 * g;
      const __m256i grid = grid8(kIq1sGrid.v, qs[0] | (h & 7u) << 8, qs[1] | (h >> 4 & 7u) << 8,
                                 qs[2] | (h >> 8 & 7u) << 8, qs[3] | (h >> 12 & 7u) << 8);
      const uint32_t minus = (h >> 3 & 1) | (h >> 6 & 2) | (h >> 9 & 4) | (h >> 12 & 8);  // bit 3 of each nibble
      set_signed(g, iq1_levels(grid, _mm256_load_si256(reinterpret_cast<const __m256i*>(kIq1Deltas.of[minus]))));
      const int k = 2 * g;  // scales of 3 bits, 4 per u16
      sc[g] = scale16((s[k / 4] >> (3 * (k % 4))) & 7u, (s[(k + 1) / 4] >> (3 * ((k + 1) % 4))) & 7u);
    }
    const uint16_t d = static_cast<uint16_t>((s[0] >> 12) | ((s[1] >> 12) << 4) | ((s[2] >> 12) << 8) | ((s[3] >> 12) << 12));
    d_ = _cvtsh_ss(d) * 0.125f;
  }
};

struct Tq2 : SignedBlock {
  static constexpr size_t kBytes = 66;
  void load(const uint8_t* b) {
    for (int c = 0; c < 2; ++c) {
      const __m256i q = loadu(b + 32 * c);
      for (int s = 0; s < 4; ++s)
        set_signed(4 * c + s, _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), mask8(3)), mask8(1)));
    }
    for (int g = 0; g < 8; ++g) sc[g] = _mm256_set1_epi16(1);
    d_ = load_f16(b + 64);
  }
};

// TQ1_0: digit n of each byte, ((byte·3^n mod 256)·3) >> 8, minus 1; 16 bytes at a time.
inline __m128i trits(__m128i bytes, int pow3) {
  const __m256i wide = _mm256_cvtepu8_epi16(bytes);
  const __m256i shifted = _mm256_and_si256(_mm256_mullo_epi16(wide, _mm256_set1_epi16(static_cast<short>(pow3))),
                                           _mm256_set1_epi16(0xff));
  const __m256i digit = _mm256_srli_epi16(_mm256_mullo_epi16(shifted, _mm256_set1_epi16(3)), 8);
  const __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(digit), _mm256_extracti128_si256(digit, 1));
  return _mm_sub_epi8(packed, _mm_set1_epi8(1));
}

struct Tq1 : SignedBlock {
  static constexpr size_t kBytes = 54;
  void load(const uint8_t* b) {
    constexpr int kPow3[5] = {1, 3, 9, 27, 81};
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16));
    const __m128i mid = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32));
    for (int n = 0; n < 5; ++n) set_signed(n, _mm256_set_m128i(trits(hi, kPow3[n]), trits(lo, kPow3[n])));
    // Columns 160 + 16n + j: digit n of byte 32 + j; 240 + 4n + j: digit n of byte 48 + j.
    const __m128i m0 = trits(mid, 1), m1 = trits(mid, 3), m2 = trits(mid, 9), m3 = trits(mid, 27), m4 = trits(mid, 81);
    const __m128i q4 = _mm_set1_epi32(static_cast<int>(u32_at(b + 48)));  // its 4 bytes in every dword
    // digit n of byte j at byte 4n + j: the dword of digit n, taken from the n-th trits result
    const __m128i t0 = trits(q4, 1), t1 = trits(q4, 3), t2 = trits(q4, 9), t3 = trits(q4, 27);
    const __m128i tail = _mm_blend_epi32(_mm_blend_epi32(t0, t1, 0x2), _mm_blend_epi32(t2, t3, 0x8), 0xc);
    set_signed(5, _mm256_set_m128i(m1, m0));
    set_signed(6, _mm256_set_m128i(m3, m2));
    set_signed(7, _mm256_set_m128i(tail, m4));
    for (int g = 0; g < 8; ++g) sc[g] = _mm256_set1_epi16(1);
    d_ = load_f16(b + 52);
  }
};

}  // namespace

void iquant_rows_avx2(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n, float* y,
                      size_t y_stride, size_t row_begin, size_t row_end) {
  switch (t) {
    case GgmlType::kIQ2_XXS: rows<Iq2Xxs>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ2_XS: rows<Iq2Xs>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ2_S: rows<Iq2S>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ3_XXS: rows<Iq3Xxs>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ3_S: rows<Iq3S>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ1_S: rows<Iq1S>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ1_M: rows<Iq1M>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kTQ1_0: rows<Tq1>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kTQ2_0: rows<Tq2>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    default: break;  // the table in ggml_kquants.cpp only routes these types here
  }
}

}  // namespace moestream::detail
