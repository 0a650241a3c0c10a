// AVX2/FMA/F16C products of the K-quant types and IQ4_XS (the lattice and ternary types:
// ggml_iquants_avx2.cpp), and the AVX2 rounding of their int8 activations; compiled with -mavx2
// -mfma -mf16c and called only when detail::avx2_usable().
// Same integer sums per super-block as kquant_rows_scalar; only the float summation order differs.
//
// Each super-block is decoded once into 8 vectors of 32 unsigned quants (u8: maddubs needs an
// unsigned side) and the scale factors, then dotted with every input of the batch (up to 4):
// maddubs(u, x) -> 16 x i16, madd with the scales -> 8 x i32. Offsets (Q3_K -4, Q6_K -32) are
// folded back with the per-16 activation sums. Pair sums stay below 2^15: |u| <= 63 (IQ4_XS:
// |w| <= 127 with the sign moved onto x) times |x| <= 127.
//
// Keep this file free of std:: templates and inline library functions (see quant_avx2.cpp: an
// AVX2 instantiation could be the one the linker keeps for CPUs without AVX2).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/ggml_kquants_avx2.h"

namespace moestream::detail {
namespace {

using namespace avx2;

// Q4_K/Q5_K header: d, dmin, 6-bit scales (as madd factors per 32 columns) and minimums (one per
// activation sum of 16).
struct K4Header {
  float d, dmin;
  __m256i sc[8], mins;
  void load(const uint8_t* b) {
    d = load_f16(b);
    dmin = load_f16(b + 2);
    uint32_t s[3];
    std::memcpy(s, b + 4, 12);
    const uint32_t sc_lo = s[0] & 0x3f3f3f3fu, m_lo = s[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (s[2] & 0x0f0f0f0fu) | (((s[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((s[2] >> 4) & 0x0f0f0f0fu) | (((s[1] >> 6) & 0x03030303u) << 4);
    const __m128i sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(sc_hi), int(sc_lo)));
    const __m256i scb = _mm256_broadcastsi128_si256(sc16);
    for (int j = 0; j < 8; ++j) sc[j] = word_of(scb, j);
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, int(m_hi), int(m_lo)));
    mins = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
  }
};

struct Q4K {
  static constexpr size_t kBytes = 144;
  static constexpr bool kMin = true;
  K4Header h;
  __m256i u[8];
  void load(const uint8_t* b) {
    h.load(b);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu(b + 16 + 32 * c);
      u[2 * c] = _mm256_and_si256(q, mask8(0x0f));
      u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask8(0x0f));
    }
  }
  float d() const { return h.d; }
  float dmin() const { return h.dmin; }
  __m256i mins() const { return h.mins; }
  __m256i dot(const int8_t* xq, const int16_t*) const { return dot8(u, h.sc, xq); }
};

// Bit s of each qh byte moved to bit 4 (the fifth bit of a Q5_K quant); s <= 7 keeps the shift
// inside the byte.
inline __m256i q5_high(__m256i qh, int s) {
  const __m256i moved = s <= 4 ? _mm256_slli_epi16(qh, 4 - s) : _mm256_srli_epi16(qh, s - 4);
  return _mm256_and_si256(moved, mask8(0x10));
}

struct Q5K {
  static constexpr size_t kBytes = 176;
  static constexpr bool kMin = true;
  K4Header h;
  __m256i u[8];
  void load(const uint8_t* b) {
    h.load(b);
    const __m256i qh = loadu(b + 16);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = loadu(b + 48 + 32 * c);
      u[2 * c] = _mm256_or_si256(_mm256_and_si256(q, mask8(0x0f)), q5_high(qh, 2 * c));
      u[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask8(0x0f)), q5_high(qh, 2 * c + 1));
    }
  }
  float d() const { return h.d; }
  float dmin() const { return h.dmin; }
  __m256i mins() const { return h.mins; }
  __m256i dot(const int8_t* xq, const int16_t*) const { return dot8(u, h.sc, xq); }
};

struct Q2K {
  static constexpr size_t kBytes = 84;
  static constexpr bool kMin = true;
  float d_, dmin_;
  __m256i u[8], sc[8], mins_;
  void load(const uint8_t* b) {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    pair_scales(_mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(0x0f))), sc);
    mins_ = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0f)));
    for (int h = 0; h < 2; ++h) {
      const __m256i q = loadu(b + 16 + 32 * h);
      for (int s2 = 0; s2 < 4; ++s2) u[4 * h + s2] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s2), mask8(3));
    }
    d_ = load_f16(b + 80);
    dmin_ = load_f16(b + 82);
  }
  float d() const { return d_; }
  float dmin() const { return dmin_; }
  __m256i mins() const { return mins_; }
  __m256i dot(const int8_t* xq, const int16_t*) const { return dot8(u, sc, xq); }
};

// Q3_K and Q6_K store q + offset unsigned: sum(sc * q * x) = sum(sc * u * x) - offset * sum(sc * bsum).
template <int kShift>  // log2 of the offset
inline __m256i dot8_offset(const __m256i* u, const __m256i* sc, __m256i sc16, const int8_t* xq,
                           const int16_t* bsums) {
  const __m256i off = _mm256_madd_epi16(loadu(bsums), sc16);
  return _mm256_sub_epi32(dot8(u, sc, xq), _mm256_slli_epi32(off, kShift));
}

struct Q3K {
  static constexpr size_t kBytes = 110;
  static constexpr bool kMin = false;
  float d_;
  __m256i u[8], sc[8], sc16;
  void load(const uint8_t* b) {
    uint32_t a[3];
    std::memcpy(a, b + 96, 12);
    // Scale k: low 4 bits from nibble (k / 8) of byte k % 8, top 2 bits from bits 2(k / 4) of byte 8 + k % 4.
    const uint32_t w0 = (a[0] & 0x0f0f0f0fu) | ((a[2] & 0x03030303u) << 4);
    const uint32_t w1 = (a[1] & 0x0f0f0f0fu) | (((a[2] >> 2) & 0x03030303u) << 4);
    const uint32_t w2 = ((a[0] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 4) & 0x03030303u) << 4);
    const uint32_t w3 = ((a[1] >> 4) & 0x0f0f0f0fu) | (((a[2] >> 6) & 0x03030303u) << 4);
    sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_set_epi32(int(w3), int(w2), int(w1), int(w0))),
                            _mm256_set1_epi16(32));
    pair_scales(sc16, sc);
    const __m256i hm = loadu(b);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = loadu(b + 32 + 32 * h);
      for (int s = 0; s < 4; ++s) {
        const int bit = 4 * h + s;  // hmask bit of this 32-column group, moved to bit 2 (+4)
        const __m256i hb = bit >= 2 ? _mm256_srli_epi16(hm, bit - 2) : _mm256_slli_epi16(hm, 2 - bit);
        u[bit] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), mask8(3)),
                                 _mm256_and_si256(hb, mask8(4)));
      }
    }
    d_ = load_f16(b + 108);
  }
  float d() const { return d_; }
  float dmin() const { return 0.0f; }
  __m256i mins() const { return _mm256_setzero_si256(); }
  __m256i dot(const int8_t* xq, const int16_t* bsums) const { return dot8_offset<2>(u, sc, sc16, xq, bsums); }
};

struct Q6K {
  static constexpr size_t kBytes = 210;
  static constexpr bool kMin = false;
  float d_;
  __m256i u[8], sc[8], sc16;
  void load(const uint8_t* b) {
    sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    pair_scales(sc16, sc);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = loadu(b + 64 * h), ql1 = loadu(b + 64 * h + 32), qh = loadu(b + 128 + 32 * h);
      const __m256i m4 = mask8(0x0f), m30 = mask8(0x30);
      u[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
      u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                     _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    }
    d_ = load_f16(b + 208);
  }
  float d() const { return d_; }
  float dmin() const { return 0.0f; }
  __m256i mins() const { return _mm256_setzero_si256(); }
  __m256i dot(const int8_t* xq, const int16_t* bsums) const { return dot8_offset<5>(u, sc, sc16, xq, bsums); }
};

alignas(16) constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

struct Iq4Xs {
  static constexpr size_t kBytes = 136;
  static constexpr bool kMin = false;
  float d_;
  __m256i w[8], aw[8], sc[8];
  void load(const uint8_t* b) {
    // Scale j: low 4 bits = bits 4j..4j+3 of the 4 bytes at 4, top 2 = bits 2j, 2j+1 of the u16 at 2.
    uint16_t sh;
    uint32_t sl;
    std::memcpy(&sh, b + 2, 2);
    std::memcpy(&sl, b + 4, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xf));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i s32 = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    const __m256i p = _mm256_packs_epi32(s32, s32);                    // [s0-3 s0-3 | s4-7 s4-7]
    const __m256i sb = _mm256_permute4x64_epi64(p, 0x88);              // [s0-7 | s0-7]
    for (int j = 0; j < 8; ++j) sc[j] = word_of(sb, j);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    for (int j = 0; j < 8; ++j) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 + 16 * j));
      const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), mask8(0x0f));
      w[j] = _mm256_shuffle_epi8(table, idx);
      aw[j] = _mm256_abs_epi8(w[j]);
    }
    d_ = load_f16(b);
  }
  float d() const { return d_; }
  float dmin() const { return 0.0f; }
  __m256i mins() const { return _mm256_setzero_si256(); }
  __m256i dot(const int8_t* xq, const int16_t*) const { return signed_dot8(w, aw, sc, xq); }
};

}  // namespace

void kquant_rows_avx2(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n,
                      float* y, size_t y_stride, size_t row_begin, size_t row_end) {
  switch (t) {
    case GgmlType::kQ2_K: rows<Q2K>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kQ3_K: rows<Q3K>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kQ4_K: rows<Q4K>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kQ5_K: rows<Q5K>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kQ6_K: rows<Q6K>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    case GgmlType::kIQ4_XS: rows<Iq4Xs>(w, cols, xa, n, y, y_stride, row_begin, row_end); break;
    default: iquant_rows_avx2(t, w, cols, xa, n, y, y_stride, row_begin, row_end); break;  // the lattice types
  }
}

void kquant_round_activations_avx2(const float* x, size_t cols, float* d, int8_t* qs, int16_t* bsums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
  for (size_t b = 0; b < cols / kSuperBlock; ++b) {
    const float* xb = x + b * kSuperBlock;
    __m256 m = _mm256_setzero_ps();
    for (size_t c = 0; c < kSuperBlock; c += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + c), abs_mask), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    d[b] = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i sums[8];
    for (size_t c = 0; c < kSuperBlock; c += 32) {
      __m256i v[4];
      for (int k = 0; k < 4; ++k) {
        __m256 f = _mm256_mul_ps(_mm256_loadu_ps(xb + c + 8 * k), id);
        f = _mm256_min_ps(_mm256_max_ps(f, lo), hi);
        v[k] = _mm256_cvtps_epi32(_mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      const __m256i q = _mm256_permutevar8x32_epi32(p, order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kSuperBlock + c), q);
      // Sums of 4 bytes: lanes 0-3 cover columns c..c+15, lanes 4-7 c+16..c+31.
      sums[c / 32] = _mm256_madd_epi16(_mm256_maddubs_epi16(mask8(1), q), _mm256_set1_epi16(1));
    }
    // Two rounds of hadd over vectors (A,B,C,D): [A0..3, B0..3, C0..3, D0..3 | A4..7, ...], i.e.
    // the even sums of 16 in the low lane and the odd ones in the high lane.
    const __m256i e0 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[0], sums[1]), _mm256_hadd_epi32(sums[2], sums[3]));
    const __m256i e1 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[4], sums[5]), _mm256_hadd_epi32(sums[6], sums[7]));
    const __m256i s16 = _mm256_packs_epi32(e0, e1);  // [0,2,..,14 | 1,3,..,15], |sum| <= 2032
    const __m128i ev = _mm256_castsi256_si128(s16), od = _mm256_extracti128_si256(s16, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bsums + b * 16), _mm_unpacklo_epi16(ev, od));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bsums + b * 16 + 8), _mm_unpackhi_epi16(ev, od));
  }
}

}  // namespace moestream::detail
