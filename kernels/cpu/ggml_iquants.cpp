// The decoders of ggml's lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and
// ternary types (TQ1_0, TQ2_0): one 256-element super-block into the KBlock that the K-quant
// dequantisation and products of ggml_kquants*.cpp consume (docs/format.md lists each layout).
//
// gguf.quants computes, per group of columns, db = d * (0.5 + s) * 0.25 (IQ2), d * (0.5 + s) * 0.5
// (IQ3_XXS), d * (1 + 2s) (IQ3_S, IQ1) and then db * grid * sign or dl * (grid +- 0.125) in float32.
// Here the same value is (d * 2^-k) * (2s + 1) * q with q the signed integer level (grid * sign,
// or 8 * grid +- 1 for IQ1): d has 11 significant bits, 2s + 1 at most 5 and q at most 6, so every
// product is exact in float32 (no rounding, no subnormal: |d| >= 2^-24) and the bits equal gguf's,
// the sign of a zero included (grid values of IQ2/IQ3 and IQ1's grid +- 1/8 are never 0).
#include <cstring>

#include "common/half.h"
#include "common/load_le.h"
#include "loader/format/ggml_iq1_grid.h"
#include "loader/format/ggml_iq2_iq3_grids.h"
#include "kernels/cpu/ggml_kquants_kernels.h"

namespace moestream::detail {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

uint16_t u16_at(const uint8_t* p) { return load_le<uint16_t>(p); }

uint32_t u32_at(const uint8_t* p) { return load_le<uint32_t>(p); }

// The `width` values of a grid entry (byte j = element j, unsigned), negated where bit j of
// `signs` is set.
void put_signed(uint64_t entry, uint32_t signs, int width, int8_t* q) {
  for (int j = 0; j < width; ++j) {
    const int v = static_cast<int>((entry >> (8 * j)) & 0xff);
    q[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}

// Scales per 16 columns: the same odd factor 2s + 1 for both halves of 32-column group g.
void scale32(KBlock& o, int g, uint32_t s) { o.scale[2 * g] = o.scale[2 * g + 1] = static_cast<int32_t>(2 * s + 1); }

void no_minimum(KBlock& o) {
  std::memset(o.min, 0, sizeof o.min);
  o.dmin = 0;
}

// IQ2_XS and IQ2_S: 8 bytes at `at`, two 4-bit scales each, low nibble first, one per 16 columns.
void nibble_scales16(const uint8_t* at, KBlock& o) {
  for (int k = 0; k < 16; ++k) o.scale[k] = 2 * ((at[k / 2] >> (4 * (k % 2))) & 0xf) + 1;
}

}  // namespace

// 66 bytes: d (f16), then per 32 columns two u32: four grid indices (bytes), and four 7-bit sign
// indices (bits 0-27, one per 8 columns) under a 4-bit scale (bits 28-31).
void decode_iq2_xxs(const uint8_t* b, KBlock& o) {
  for (int g = 0; g < 8; ++g) {
    const uint8_t* p = b + 2 + 8 * g;
    const uint32_t aux = u32_at(p + 4);
    scale32(o, g, aux >> 28);
    for (int l = 0; l < 4; ++l) put_signed(kIq2xxsGrid[p[l]], kIqSigns[(aux >> (7 * l)) & 127], 8, o.q + 32 * g + 8 * l);
  }
  o.d = f16_at(b) * 0.125f;  // d * (0.5 + s) * 0.25 = (d / 8) * (2s + 1)
  no_minimum(o);
}

// 74 bytes: d, 32 u16 (per 8 columns: a 9-bit grid index, a 7-bit sign index above it), 8 scale bytes.
void decode_iq2_xs(const uint8_t* b, KBlock& o) {
  for (int i = 0; i < 32; ++i) {
    const uint16_t v = u16_at(b + 2 + 2 * i);
    put_signed(kIq2xsGrid[v & 511], kIqSigns[v >> 9], 8, o.q + 8 * i);
  }
  nibble_scales16(b + 66, o);
  o.d = f16_at(b) * 0.125f;
  no_minimum(o);
}

// 82 bytes: d, 32 low bytes of the 10-bit grid indices, 32 sign bytes (one bit per column), 8
// bytes of the indices' top 2 bits (four per byte, low bits first), 8 scale bytes.
void decode_iq2_s(const uint8_t* b, KBlock& o) {
  const uint8_t* qs = b + 2;
  const uint8_t* signs = b + 34;
  const uint8_t* qh = b + 66;
  for (int i = 0; i < 32; ++i) {
    const uint32_t idx = qs[i] | (((qh[i / 4] >> (2 * (i % 4))) & 3u) << 8);
    put_signed(kIq2sGrid[idx], signs[i], 8, o.q + 8 * i);
  }
  nibble_scales16(b + 74, o);
  o.d = f16_at(b) * 0.125f;
  no_minimum(o);
}

// 98 bytes: d, 64 grid indices (one per 4 columns), then per 32 columns a u32 as IQ2_XXS's second.
void decode_iq3_xxs(const uint8_t* b, KBlock& o) {
  const uint8_t* qs = b + 2;
  for (int g = 0; g < 8; ++g) {
    const uint32_t aux = u32_at(b + 66 + 4 * g);
    scale32(o, g, aux >> 28);
    for (int l = 0; l < 4; ++l) {
      const uint32_t signs = kIqSigns[(aux >> (7 * l)) & 127];
      int8_t* q = o.q + 32 * g + 8 * l;
      put_signed(kIq3xxsGrid[qs[8 * g + 2 * l]], signs, 4, q);
      put_signed(kIq3xxsGrid[qs[8 * g + 2 * l + 1]], signs >> 4, 4, q + 4);
    }
  }
  o.d = f16_at(b) * 0.25f;  // d * (0.5 + s) * 0.5 = (d / 4) * (2s + 1)
  no_minimum(o);
}

// 110 bytes: d, 64 low bytes of the 9-bit grid indices (one per 4 columns), 8 bytes of their top
// bits (bit i % 8 of byte i / 8), 32 sign bytes, 4 bytes of 4-bit scales (one per 32 columns).
void decode_iq3_s(const uint8_t* b, KBlock& o) {
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  for (int i = 0; i < 64; ++i) {
    const uint32_t idx = qs[i] | (((qh[i / 8] >> (i % 8)) & 1u) << 8);
    put_signed(kIq3sGrid[idx], signs[i / 2] >> (4 * (i % 2)), 4, o.q + 4 * i);
  }
  for (int g = 0; g < 8; ++g) scale32(o, g, (b[106 + g / 2] >> (4 * (g % 2))) & 0xf);
  o.d = f16_at(b);  // d * (1 + 2s)
  no_minimum(o);
}

namespace {

// IQ1: the 8 grid values g in {-1, 0, 1} of entry idx as 8 * g + delta (delta = +-1, i.e. +-1/8
// in units of d / 8).
void put_iq1(uint32_t idx, int delta, int8_t* q) {
  const uint64_t e = kIq1sGrid[idx];
  for (int j = 0; j < 8; ++j) q[j] = static_cast<int8_t>(8 * static_cast<int8_t>((e >> (8 * j)) & 0xff) + delta);
}

}  // namespace

// 50 bytes: d, 32 low bytes of the 11-bit grid indices (one per 8 columns), then per 32 columns a
// u16: the indices' top 3 bits (bits 0-11), a 3-bit scale (12-14) and the sign of delta (15).
void decode_iq1_s(const uint8_t* b, KBlock& o) {
  for (int g = 0; g < 8; ++g) {
    const uint16_t h = u16_at(b + 34 + 2 * g);
    scale32(o, g, (h >> 12) & 7);
    const int delta = (h & 0x8000) ? -1 : 1;
    for (int l = 0; l < 4; ++l) put_iq1(b[2 + 4 * g + l] | (((h >> (3 * l)) & 7u) << 8), delta, o.q + 32 * g + 8 * l);
  }
  o.d = f16_at(b) * 0.125f;  // d * (2s + 1) * (g +- 1/8) = (d / 8) * (2s + 1) * (8g +- 1)
  no_minimum(o);
}

// 56 bytes: 32 low bytes of the grid indices, 16 bytes of nibbles (per 8 columns, low nibble first:
// the index's top 3 bits and the sign of delta in bit 3), 4 u16 holding 3-bit scales (bits 0-11,
// one per 16 columns) and, in their top nibbles, the f16 d (word w's nibble = bits 4w..4w+3 of d).
void decode_iq1_m(const uint8_t* b, KBlock& o) {
  const uint8_t* qh = b + 32;
  uint16_t sc[4];
  for (int w = 0; w < 4; ++w) sc[w] = u16_at(b + 48 + 2 * w);
  for (int k = 0; k < 16; ++k) o.scale[k] = 2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1;
  for (int i = 0; i < 32; ++i) {
    const uint32_t nib = (qh[i / 2] >> (4 * (i % 2))) & 0xf;
    put_iq1(b[i] | ((nib & 7) << 8), (nib & 8) ? -1 : 1, o.q + 8 * i);
  }
  const uint16_t d = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 12) << 4) | ((sc[2] >> 12) << 8) |
                                           ((sc[3] >> 12) << 12));
  o.d = f16_to_f32(d) * 0.125f;
  no_minimum(o);
}

namespace {

// A base-3 digit of a TQ1_0 byte: the byte holds ceil(v * 256 / 243) for a 5-digit (or 4-digit)
// value v; multiplying by 3^n (mod 256) brings digit n to the top, read as (byte * 3) >> 8.
int8_t trit(uint8_t byte, uint8_t pow3) {
  const uint8_t shifted = static_cast<uint8_t>(byte * pow3);
  return static_cast<int8_t>(((shifted * 3u) >> 8) - 1);
}

void unit_scales(KBlock& o) {
  for (int k = 0; k < 16; ++k) o.scale[k] = 1;
}

}  // namespace

// 54 bytes: 48 bytes of five trits each (columns 32n + j from byte j < 32, 160 + 16n + j from
// byte 32 + j), 4 bytes of four trits (columns 240 + 4n + j from byte 48 + j), d. q = trit - 1.
void decode_tq1_0(const uint8_t* b, KBlock& o) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  for (int n = 0; n < 5; ++n) {
    for (int j = 0; j < 32; ++j) o.q[32 * n + j] = trit(b[j], kPow3[n]);
    for (int j = 0; j < 16; ++j) o.q[160 + 16 * n + j] = trit(b[32 + j], kPow3[n]);
  }
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) o.q[240 + 4 * n + j] = trit(b[48 + j], kPow3[n]);
  unit_scales(o);
  o.d = f16_at(b + 52);
  no_minimum(o);
}

// 66 bytes: 64 bytes of four 2-bit values (column 128c + 32s + j from bits 2s of byte 32c + j), d.
// q = value - 1.
void decode_tq2_0(const uint8_t* b, KBlock& o) {
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 32; ++j) o.q[128 * c + 32 * s + j] = static_cast<int8_t>(((b[32 * c + j] >> (2 * s)) & 3) - 1);
  unit_scales(o);
  o.d = f16_at(b + 64);
  no_minimum(o);
}

}  // namespace moestream::detail
