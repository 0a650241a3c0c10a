// The 256-element super-block types of ggml (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and through
// the decoders of ggml_iquants.cpp IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0,
// TQ2_0): block decoding, the bit-exact dequantisation, the int8 activation rounding and the
// scalar products, and their GgmlKernels entries (the AVX2 products are in ggml_kquants_avx2.cpp).
//
// Every type decodes a super-block to 256 small integers q, a scale per 16 columns, a minimum per
// 16 columns (Q2_K, Q4_K, Q5_K; 0 for the others) and two float32 factors d and dmin (f16 in the
// file). The value of column e is (d * scale) * q - (dmin * min), in that float32 order, which is
// how the gguf package's reference computes it (docs/format.md lists each layout).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_kquants_kernels.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream::detail {
namespace {

// IQ4_NL's non-linear 4-bit code book, shared by IQ4_XS (a constant of the format).
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_K/Q5_K: 8 six-bit scales and 8 six-bit minimums in 12 bytes. Bytes 0-3 hold scales 0-3 in
// their low 6 bits, bytes 4-7 minimums 0-3; scales/minimums 4-7 take their low 4 bits from the
// low/high nibble of bytes 8-11 and their top 2 bits from the top 2 bits of bytes 0-3 / 4-7.
void k4_scales_mins(const uint8_t* s, int32_t* sc, int32_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0xf) | ((s[j] >> 6) << 4);
    m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

void decode_q2_k(const uint8_t* b, KBlock& o) {
  const uint8_t* qs = b + 16;
  for (int k = 0; k < 16; ++k) {
    o.scale[k] = b[k] & 0xf;
    o.min[k] = b[k] >> 4;
  }
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 32; ++j) o.q[h * 128 + s * 32 + j] = static_cast<int8_t>((qs[h * 32 + j] >> (2 * s)) & 3);
  o.d = f16_at(b + 80);
  o.dmin = f16_at(b + 82);
}

void decode_q3_k(const uint8_t* b, KBlock& o) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* s = b + 96;
  for (int k = 0; k < 16; ++k) {
    const int lo = k < 8 ? (s[k] & 0xf) : (s[k - 8] >> 4);
    const int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    o.scale[k] = (lo | (hi << 4)) - 32;
    o.min[k] = 0;
  }
  for (int h = 0; h < 2; ++h)
    for (int s2 = 0; s2 < 4; ++s2)
      for (int j = 0; j < 32; ++j) {
        const int low = (qs[h * 32 + j] >> (2 * s2)) & 3;
        const bool high = (hm[j] >> (4 * h + s2)) & 1;  // a clear bit subtracts 4
        o.q[h * 128 + s2 * 32 + j] = static_cast<int8_t>(low - (high ? 0 : 4));
      }
  o.d = f16_at(b + 108);
  o.dmin = 0;
}

// Q4_K and Q5_K share the header (d, dmin, 12 scale bytes) and the nibble order.
void decode_k4_header(const uint8_t* b, KBlock& o) {
  int32_t sc[8], m[8];
  k4_scales_mins(b + 4, sc, m);
  for (int k = 0; k < 16; ++k) {
    o.scale[k] = sc[k / 2];
    o.min[k] = m[k / 2];
  }
  o.d = f16_at(b);
  o.dmin = f16_at(b + 2);
}

void decode_q4_k(const uint8_t* b, KBlock& o) {
  decode_k4_header(b, o);
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int j = 0; j < 32; ++j) {
      o.q[c * 64 + j] = static_cast<int8_t>(qs[c * 32 + j] & 0xf);
      o.q[c * 64 + 32 + j] = static_cast<int8_t>(qs[c * 32 + j] >> 4);
    }
}

void decode_q5_k(const uint8_t* b, KBlock& o) {
  decode_k4_header(b, o);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c)
    for (int j = 0; j < 32; ++j) {
      const int h0 = (qh[j] >> (2 * c)) & 1, h1 = (qh[j] >> (2 * c + 1)) & 1;
      o.q[c * 64 + j] = static_cast<int8_t>((qs[c * 32 + j] & 0xf) | (h0 << 4));
      o.q[c * 64 + 32 + j] = static_cast<int8_t>((qs[c * 32 + j] >> 4) | (h1 << 4));
    }
}

void decode_q6_k(const uint8_t* b, KBlock& o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int k = 0; k < 16; ++k) {
    o.scale[k] = static_cast<int8_t>(b[192 + k]);
    o.min[k] = 0;
  }
  // Per half of 128: columns t*32 + j take ql byte (t&1)*32 + j, nibble t>>1, and qh bits 2t, 2t+1.
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 32; ++j) {
        const int low = (ql[h * 64 + (t & 1) * 32 + j] >> (4 * (t >> 1))) & 0xf;
        const int high = (qh[h * 32 + j] >> (2 * t)) & 3;
        o.q[h * 128 + t * 32 + j] = static_cast<int8_t>((low | (high << 4)) - 32);
      }
  o.d = f16_at(b + 208);
  o.dmin = 0;
}

void decode_iq4_xs(const uint8_t* b, KBlock& o) {
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int k = 0; k < 16; ++k) {
    const int sb = k / 2;
    o.scale[k] = (((sl[sb / 2] >> (4 * (sb % 2))) & 0xf) | (((sh >> (2 * sb)) & 3) << 4)) - 32;
    o.min[k] = 0;
  }
  for (int sb = 0; sb < 8; ++sb)
    for (int j = 0; j < 16; ++j) {
      o.q[sb * 32 + j] = kIq4Values[qs[sb * 16 + j] & 0xf];
      o.q[sb * 32 + 16 + j] = kIq4Values[qs[sb * 16 + j] >> 4];
    }
  o.d = f16_at(b);
  o.dmin = 0;
}

struct TypeDesc {
  KDecodeFn decode;
  size_t block_bytes;
  bool has_min;
};

TypeDesc desc_of(GgmlType t) {
  switch (t) {
    case GgmlType::kQ2_K: return {decode_q2_k, 84, true};
    case GgmlType::kQ3_K: return {decode_q3_k, 110, false};
    case GgmlType::kQ4_K: return {decode_q4_k, 144, true};
    case GgmlType::kQ5_K: return {decode_q5_k, 176, true};
    case GgmlType::kQ6_K: return {decode_q6_k, 210, false};
    case GgmlType::kIQ4_XS: return {decode_iq4_xs, 136, false};
    case GgmlType::kIQ2_XXS: return {decode_iq2_xxs, 66, false};
    case GgmlType::kIQ2_XS: return {decode_iq2_xs, 74, false};
    case GgmlType::kIQ2_S: return {decode_iq2_s, 82, false};
    case GgmlType::kIQ3_XXS: return {decode_iq3_xxs, 98, false};
    case GgmlType::kIQ3_S: return {decode_iq3_s, 110, false};
    case GgmlType::kIQ1_S: return {decode_iq1_s, 50, false};
    case GgmlType::kIQ1_M: return {decode_iq1_m, 56, false};
    case GgmlType::kTQ1_0: return {decode_tq1_0, 54, false};
    case GgmlType::kTQ2_0: return {decode_tq2_0, 66, false};
    default: break;
  }
  MOE_ASSERT(false, "not a K-quant type: " + std::string(ggml_type_name(t)));
  return {};
}

}  // namespace

void kquant_dequantize(GgmlType t, const uint8_t* src, size_t n, float* dst) {
  MOE_ASSERT(n % kSuperBlock == 0, "K-quant row of " + std::to_string(n) + " elements");
  const TypeDesc td = desc_of(t);
  KBlock blk;
  for (size_t b = 0; b < n / kSuperBlock; ++b) {
    td.decode(src + b * td.block_bytes, blk);
    float* out = dst + b * kSuperBlock;
    for (int k = 0; k < 16; ++k) {
      // For types without a minimum dmin and min are +0, and v - (+0) is v for every v.
      const float dl = blk.d * static_cast<float>(blk.scale[k]);
      const float ml = blk.dmin * static_cast<float>(blk.min[k]);
      for (int e = 0; e < 16; ++e) out[k * 16 + e] = dl * static_cast<float>(blk.q[k * 16 + e]) - ml;
    }
  }
}

void kquant_round_activations(const float* x, size_t cols, float* d, int8_t* qs, int16_t* bsums) {
  for (size_t b = 0; b < cols / kSuperBlock; ++b) {
    const float* xb = x + b * kSuperBlock;
    float amax = 0.0f;
    for (size_t c = 0; c < kSuperBlock; ++c) {
      const float a = std::fabs(xb[c]);
      amax = a > amax ? a : amax;  // a NaN is skipped, as _mm256_max_ps(a, amax) skips it
    }
    d[b] = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int8_t* q = qs + b * kSuperBlock;
    for (size_t c = 0; c < kSuperBlock; ++c) {
      float v = xb[c] * id;
      v = v > -127.0f ? v : -127.0f;  // the operand order of _mm256_max_ps / _mm256_min_ps
      v = v < 127.0f ? v : 127.0f;
      q[c] = static_cast<int8_t>(std::nearbyint(v));
    }
    for (size_t k = 0; k < kSuperBlock / kSubBlock16; ++k) {
      int s = 0;
      for (size_t e = 0; e < kSubBlock16; ++e) s += q[k * kSubBlock16 + e];
      bsums[b * 16 + k] = static_cast<int16_t>(s);
    }
  }
}

void kquant_rows_scalar(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n,
                        float* y, size_t y_stride, size_t row_begin, size_t row_end) {
  const TypeDesc td = desc_of(t);
  const size_t nb = cols / kSuperBlock;
  constexpr size_t kInputs = 8;  // inputs sharing one decoded super-block
  KBlock blk;
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + r * nb * td.block_bytes;
    for (size_t i0 = 0; i0 < n; i0 += kInputs) {
      const size_t ni = std::min(kInputs, n - i0);
      float acc[kInputs] = {};
      for (size_t b = 0; b < nb; ++b) {
        td.decode(row + b * td.block_bytes, blk);
        for (size_t i = 0; i < ni; ++i) {
          const size_t xb = (i0 + i) * nb + b;
          const int8_t* xq = xa.qs + xb * kSuperBlock;
          int32_t isum = 0;
          for (int k = 0; k < 16; ++k) {
            int32_t s = 0;
            for (int e = 0; e < 16; ++e) s += blk.q[k * 16 + e] * xq[k * 16 + e];
            isum += blk.scale[k] * s;
          }
          const float dx = xa.d[xb];
          acc[i] += (dx * blk.d) * static_cast<float>(isum);
          if (td.has_min) {
            int32_t msum = 0;
            for (int k = 0; k < 16; ++k) msum += blk.min[k] * xa.bsums[xb * 16 + k];
            acc[i] -= (dx * blk.dmin) * static_cast<float>(msum);
          }
        }
      }
      for (size_t i = 0; i < ni; ++i) y[(i0 + i) * y_stride + r] = acc[i];
    }
  }
}

#if !defined(MOESTREAM_AVX2_KERNELS)
void kquant_round_activations_avx2(const float*, size_t, float*, int8_t*, int16_t*) {
  MOE_ASSERT(false, "kquant_round_activations_avx2 called in a build without the AVX2 kernels");
}
void kquant_rows_avx2(GgmlType, const uint8_t*, size_t, const KActivations&, size_t, float*, size_t,
                      size_t, size_t) {
  MOE_ASSERT(false, "kquant_rows_avx2 called in a build without the AVX2 kernels");
}
#endif

void KActivationBuffers::fit(size_t cols, size_t n) {
  const size_t nb = cols / kSuperBlock;
  if (d.size() < n * nb) d.resize(n * nb);
  if (qs.size() < n * cols) qs.resize(n * cols);
  if (bsums.size() < n * nb * 16) bsums.resize(n * nb * 16);
}

KActivations kquant_round_into(KActivationBuffers& s, const float* x, size_t cols, size_t n, bool avx2) {
  MOE_ASSERT(cols % kSuperBlock == 0, "K-quant matrix of " + std::to_string(cols) + " columns");
  s.fit(cols, n);
  const size_t nb = cols / kSuperBlock;
  auto round = avx2 ? kquant_round_activations_avx2 : kquant_round_activations;
  for (size_t i = 0; i < n; ++i) {
    round(x + i * cols, cols, s.d.data() + i * nb, s.qs.data() + i * cols, s.bsums.data() + i * nb * 16);
  }
  return {s.d.data(), s.qs.data(), s.bsums.data(), nb};
}

namespace {

// Per-thread rounded inputs (threads call the products concurrently on disjoint row ranges).
// Growing only: after the widest call, or ggml_reserve_scratch, a thread never allocates again.
KActivationBuffers& scratch() {
  thread_local KActivationBuffers s;
  return s;
}

KActivations round_inputs(const float* x, size_t cols, size_t n, bool avx2) {
  return kquant_round_into(scratch(), x, cols, n, avx2);
}

template <GgmlType T>
void dequantize_entry(const uint8_t* src, size_t n, float* dst) {
  kquant_dequantize(T, src, n, dst);
}

template <GgmlType T, bool kAvx2>
void matmul_entry(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  const KActivations xa = round_inputs(x, cols, n, kAvx2);
  if constexpr (kAvx2) kquant_rows_avx2(T, w, cols, xa, n, y, y_stride, row_begin, row_end);
  else kquant_rows_scalar(T, w, cols, xa, n, y, y_stride, row_begin, row_end);
}

template <GgmlType T, bool kAvx2>
void matvec_entry(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin,
                  size_t row_end) {
  matmul_entry<T, kAvx2>(w, cols, x, 1, y, 0, row_begin, row_end);
}

template <GgmlType T>
constexpr GgmlKernels entry() {
  GgmlKernels k;
  k.dequantize = dequantize_entry<T>;
  k.matvec_scalar = matvec_entry<T, false>;
  k.matmul_scalar = matmul_entry<T, false>;
#if defined(MOESTREAM_AVX2_KERNELS)
  k.matvec_avx2 = matvec_entry<T, true>;
  k.matmul_avx2 = matmul_entry<T, true>;
#endif
  return k;
}

constexpr GgmlKernels kQ2K = entry<GgmlType::kQ2_K>();
constexpr GgmlKernels kQ3K = entry<GgmlType::kQ3_K>();
constexpr GgmlKernels kQ4K = entry<GgmlType::kQ4_K>();
constexpr GgmlKernels kQ5K = entry<GgmlType::kQ5_K>();
constexpr GgmlKernels kQ6K = entry<GgmlType::kQ6_K>();
constexpr GgmlKernels kIq4Xs = entry<GgmlType::kIQ4_XS>();
constexpr GgmlKernels kIq2Xxs = entry<GgmlType::kIQ2_XXS>();
constexpr GgmlKernels kIq2Xs = entry<GgmlType::kIQ2_XS>();
constexpr GgmlKernels kIq2S = entry<GgmlType::kIQ2_S>();
constexpr GgmlKernels kIq3Xxs = entry<GgmlType::kIQ3_XXS>();
constexpr GgmlKernels kIq3S = entry<GgmlType::kIQ3_S>();
constexpr GgmlKernels kIq1S = entry<GgmlType::kIQ1_S>();
constexpr GgmlKernels kIq1M = entry<GgmlType::kIQ1_M>();
constexpr GgmlKernels kTq1 = entry<GgmlType::kTQ1_0>();
constexpr GgmlKernels kTq2 = entry<GgmlType::kTQ2_0>();

}  // namespace

const GgmlKernels* ggml_kquant_kernels(GgmlType t) {
  switch (t) {
    case GgmlType::kQ2_K: return &kQ2K;
    case GgmlType::kQ3_K: return &kQ3K;
    case GgmlType::kQ4_K: return &kQ4K;
    case GgmlType::kQ5_K: return &kQ5K;
    case GgmlType::kQ6_K: return &kQ6K;
    case GgmlType::kIQ4_XS: return &kIq4Xs;
    case GgmlType::kIQ2_XXS: return &kIq2Xxs;
    case GgmlType::kIQ2_XS: return &kIq2Xs;
    case GgmlType::kIQ2_S: return &kIq2S;
    case GgmlType::kIQ3_XXS: return &kIq3Xxs;
    case GgmlType::kIQ3_S: return &kIq3S;
    case GgmlType::kIQ1_S: return &kIq1S;
    case GgmlType::kIQ1_M: return &kIq1M;
    case GgmlType::kTQ1_0: return &kTq1;
    case GgmlType::kTQ2_0: return &kTq2;
    default: return nullptr;
  }
}

void ggml_kquant_reserve_scratch(size_t max_cols, size_t max_inputs) {
  scratch().fit((max_cols + kSuperBlock - 1) / kSuperBlock * kSuperBlock, max_inputs);
}

}  // namespace moestream::detail
