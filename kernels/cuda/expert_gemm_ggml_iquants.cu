// ggml's lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and ternary types
// (TQ1_0, TQ2_0) on the GPU: the block decoders of the GgmlCodec tile loop (ggml_codec.cuh).
// A warp takes one 256-column super-block per step; lane l decodes columns 8l..8l+7, which in the
// lattice types are one 8-value grid entry (IQ2, IQ1) or two 4-value ones (IQ3). Layouts: docs/
// format.md and the CPU decoders (kernels/cpu/ggml_iquants.cpp), whose grids these share
// (loader/format/ggml_iq*_grid*.h, generated from the gguf package).
//
// Values are (d * 2^-k * (2s + 1)) * q with q a signed integer level, as the CPU computes them:
// every product is exact in float32 (see ggml_iquants.cpp), so dequantize_rows equals the CPU bit
// for bit. The levels are assembled as int8 bytes in two words and read by sbyte (no
// int-to-float converter: expert_gemm.cuh).
#include "loader/format/ggml_iq1_grid.h"
#include "loader/format/ggml_iq2_iq3_grids.h"
#include "kernels/cuda/ggml_codec.cuh"

namespace moestream::gpu {
namespace {

// The tables in global memory: lanes read different entries, which __constant__ memory would
// serialise. Copied from the CPU's constexpr tables at compile time.
__device__ const detail::Iq2xxsGrid kIq2xxsGridGpu = detail::kIq2xxsGrid;
__device__ const detail::Iq2xsGrid kIq2xsGridGpu = detail::kIq2xsGrid;
__device__ const detail::Iq2sGrid kIq2sGridGpu = detail::kIq2sGrid;
__device__ const detail::Iq3xxsGrid kIq3xxsGridGpu = detail::kIq3xxsGrid;
__device__ const detail::Iq3sGrid kIq3sGridGpu = detail::kIq3sGrid;
__device__ const detail::Iq1sGrid kIq1sGridGpu = detail::kIq1sGrid;

// The sign byte of a 7-bit sign index (kIqSigns[i]): the index with bit 7 making the count of set
// bits even, which the generator checks of the table; computed, not looked up.
__device__ __forceinline__ uint32_t iq_signs(uint32_t i) { return i | ((__popc(i) & 1u) << 7); }

struct EightPerLaneCols {
  static constexpr int kBlockElems = 256;
  static constexpr int kLanes = 32;
  __device__ static void cols(int lane, int& a, int& b) {
    a = 8 * lane;
    b = a + 4;
  }
};

// Bits 0..3 of s as bytes 0xff (set) or 0x00.
__device__ __forceinline__ uint32_t sign_mask4(uint32_t s) {
  return (((s & 0xfu) * 0x00204081u) & 0x01010101u) * 0xffu;
}
// Bytes of v (each below 128) negated where the byte of m is 0xff: (v ^ m) - m per byte.
__device__ __forceinline__ uint32_t negate_where(uint32_t v, uint32_t m) {
  return __vsub4(v ^ m, m);
}

// w = dl * q for the 8 int8 levels in lo (columns 0-3) and hi (4-7).
__device__ __forceinline__ void signed_values(uint32_t lo, uint32_t hi, float dl, float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fmul_rn(dl, sbyte(lo, e));
    w[4 + e] = __fmul_rn(dl, sbyte(hi, e));
  }
}

// An 8-value grid entry with 8 sign bits (bit j: element j negative) as levels, times dl.
__device__ __forceinline__ void grid8_values(uint64_t entry, uint32_t signs, float dl, float* w) {
  signed_values(negate_where(uint32_t(entry), sign_mask4(signs)),
                negate_where(uint32_t(entry >> 32), sign_mask4(signs >> 4)), dl, w);
}

// The factor of a 32-column group's (or 16 columns') odd scale 2s + 1.
__device__ __forceinline__ float odd_scale(float d, uint32_t s) {
  return __fmul_rn(d, float(2 * s + 1));
}

// IQ2_XXS (66 bytes, 2-byte aligned): d, then per group g = lane / 4 two u32 at 2 + 8g: four grid
// indices (byte t), and four 7-bit sign indices (bits 7t) under the 4-bit scale (bits 28-31).
struct BtIQ2_XXS : EightPerLaneCols {
  static constexpr int kBytes = 66;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int g = lane >> 2, t = lane & 3;
    const float d = __fmul_rn(load_half(blk), 0.125f);
    const uint32_t aux = ld_u32(blk + 6 + 8 * g);
    const uint64_t entry = kIq2xxsGridGpu.v[__ldg(blk + 2 + 8 * g + t)];
    grid8_values(entry, iq_signs((aux >> (7 * t)) & 127), odd_scale(d, aux >> 28), w);
  }
};

// IQ2_XS (74 bytes, 2-byte aligned): d, 32 u16 (per 8 columns: 9-bit grid index, 7-bit sign index
// above), 8 bytes of 4-bit scales (one per 16 columns, low nibble first).
struct BtIQ2_XS : EightPerLaneCols {
  static constexpr int kBytes = 74;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const float d = __fmul_rn(load_half(blk), 0.125f);
    const uint32_t v = __ldg(reinterpret_cast<const unsigned short*>(blk + 2 + 2 * lane));
    const uint32_t s = (__ldg(blk + 66 + (lane >> 2)) >> (4 * ((lane >> 1) & 1))) & 0xfu;
    grid8_values(kIq2xsGridGpu.v[v & 511], iq_signs(v >> 9), odd_scale(d, s), w);
  }
};

// IQ2_S (82 bytes, 2-byte aligned): d, 32 low index bytes, 32 sign bytes (bit j: column 8i + j),
// 8 bytes of the indices' top 2 bits (four per byte), 8 bytes of 4-bit scales as IQ2_XS.
struct BtIQ2_S : EightPerLaneCols {
  static constexpr int kBytes = 82;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const float d = __fmul_rn(load_half(blk), 0.125f);
    const uint32_t idx =
        __ldg(blk + 2 + lane) | (((__ldg(blk + 66 + (lane >> 2)) >> (2 * (lane & 3))) & 3u) << 8);
    const uint32_t s = (__ldg(blk + 74 + (lane >> 2)) >> (4 * ((lane >> 1) & 1))) & 0xfu;
    grid8_values(kIq2sGridGpu.v[idx], __ldg(blk + 34 + lane), odd_scale(d, s), w);
  }
};

// IQ3_XXS (98 bytes, 2-byte aligned): d, 64 grid indices (one per 4 columns), then per group g a
// u32 at 66 + 4g as IQ2_XXS's second; the d factor is d / 4.
struct BtIQ3_XXS : EightPerLaneCols {
  static constexpr int kBytes = 98;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int g = lane >> 2, t = lane & 3;
    const float d = __fmul_rn(load_half(blk), 0.25f);
    const uint32_t aux = ld_u32(blk + 66 + 4 * g);
    const uint32_t signs = iq_signs((aux >> (7 * t)) & 127);
    const uint32_t lo = __ldg(&kIq3xxsGridGpu.v[__ldg(blk + 2 + 2 * lane)]);
    const uint32_t hi = __ldg(&kIq3xxsGridGpu.v[__ldg(blk + 3 + 2 * lane)]);
    signed_values(negate_where(lo, sign_mask4(signs)), negate_where(hi, sign_mask4(signs >> 4)),
                  odd_scale(d, aux >> 28), w);
  }
};

// IQ3_S (110 bytes, 2-byte aligned): d, 64 low index bytes (one per 4 columns), 8 bytes of their
// 9th bits (bit i % 8 of byte i / 8), 32 sign bytes (bit j: column 8i + j), 4 bytes of 4-bit
// scales (one per 32 columns); the d factor is d itself.
struct BtIQ3_S : EightPerLaneCols {
  static constexpr int kBytes = 110;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int i = 2 * lane;
    const float d = load_half(blk);
    const uint32_t high = __ldg(blk + 66 + (i >> 3)) >> (i & 7);
    const uint32_t lo = __ldg(&kIq3sGridGpu.v[__ldg(blk + 2 + i) | ((high & 1u) << 8)]);
    const uint32_t hi = __ldg(&kIq3sGridGpu.v[__ldg(blk + 3 + i) | ((high & 2u) << 7)]);
    const uint32_t signs = __ldg(blk + 74 + lane);
    const uint32_t s = (__ldg(blk + 106 + (lane >> 3)) >> (4 * ((lane >> 2) & 1))) & 0xfu;
    signed_values(negate_where(lo, sign_mask4(signs)), negate_where(hi, sign_mask4(signs >> 4)),
                  odd_scale(d, s), w);
  }
};

// IQ1's levels 8 * g + delta of a grid entry g in {-1, 0, 1} (int8 bytes) per byte: 8g is the
// entry shifted by 3 with each byte's borrowed low bits cleared; delta is +1 or -1 in every byte.
__device__ __forceinline__ void iq1_values(uint64_t entry, bool minus, float dl, float* w) {
  const uint32_t delta = minus ? 0xffffffffu : 0x01010101u;
  const uint32_t lo = __vadd4((uint32_t(entry) << 3) & 0xf8f8f8f8u, delta);
  const uint32_t hi = __vadd4((uint32_t(entry >> 32) << 3) & 0xf8f8f8f8u, delta);
  signed_values(lo, hi, dl, w);
}

// IQ1_S (50 bytes, 2-byte aligned): d, 32 low bytes of the 11-bit grid indices, per group g a u16
// at 34 + 2g: the indices' top 3 bits (3t), a 3-bit scale (12-14), the sign of delta (15).
struct BtIQ1_S : EightPerLaneCols {
  static constexpr int kBytes = 50;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int g = lane >> 2, t = lane & 3;
    const float d = __fmul_rn(load_half(blk), 0.125f);
    const uint32_t h = __ldg(reinterpret_cast<const unsigned short*>(blk + 34 + 2 * g));
    const uint32_t idx = __ldg(blk + 2 + lane) | (((h >> (3 * t)) & 7u) << 8);
    iq1_values(kIq1sGridGpu.v[idx], (h & 0x8000u) != 0, odd_scale(d, (h >> 12) & 7u), w);
  }
};

// IQ1_M (56 bytes, 4-byte aligned): 32 low index bytes, 16 bytes of nibbles (per 8 columns: the
// index's top 3 bits, the sign of delta in bit 3), 4 u16 with 3-bit scales (one per 16 columns,
// bits 3k) whose top nibbles hold the f16 d (word w: bits 4w..4w+3).
struct BtIQ1_M : EightPerLaneCols {
  static constexpr int kBytes = 56;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const uint32_t sc01 = ld_u32_aligned(blk + 48), sc23 = ld_u32_aligned(blk + 52);
    const uint32_t dbits = ((sc01 >> 12) & 0xfu) | ((sc01 >> 24) & 0xf0u) |
                           ((sc23 >> 4) & 0xf00u) | ((sc23 >> 16) & 0xf000u);
    const float d = __fmul_rn(half_bits(dbits), 0.125f);
    const int k = lane >> 1;
    const uint32_t sc = (k < 8 ? sc01 : sc23) >> (16 * ((k >> 2) & 1));
    const uint32_t nib = (__ldg(blk + 32 + (lane >> 1)) >> (4 * (lane & 1))) & 0xfu;
    iq1_values(kIq1sGridGpu.v[__ldg(blk + lane) | ((nib & 7u) << 8)], (nib & 8u) != 0,
               odd_scale(d, (sc >> (3 * (k & 3))) & 7u), w);
  }
};

// The ternary types' levels: unsigned digits u in {0, 1, 2} per byte, q = u - 1, scale 1.
__device__ __forceinline__ void ternary_values(uint32_t lo, uint32_t hi, float d, float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fmul_rn(d, byte_minus(lo, e, 1.0f));
    w[4 + e] = __fmul_rn(d, byte_minus(hi, e, 1.0f));
  }
}

// Base-3 digit n of each byte of v: the byte holds ceil(value * 256 / 243); times 3^n (mod 256)
// brings digit n to the top, read as (byte * 3) >> 8.
__device__ __forceinline__ uint32_t trits(uint32_t v, uint32_t pow3) {
  uint32_t out = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t shifted = (((v >> (8 * e)) & 0xffu) * pow3) & 0xffu;
    out |= ((shifted * 3u) >> 8) << (8 * e);
  }
  return out;
}

// TQ1_0's 4 columns from c: columns 32n + j from byte j < 32 (c < 160), 160 + 16n + j from byte
// 32 + j (c < 240), 240 + 4n + j from byte 48 + j; digit n.
__device__ __forceinline__ uint32_t tq1_run(const uint8_t* blk, int c) {
  int byte, n;
  if (c < 160) {
    n = c >> 5;
    byte = c & 31;
  } else if (c < 240) {
    n = (c - 160) >> 4;
    byte = 32 + ((c - 160) & 15);
  } else {
    n = (c - 240) >> 2;
    byte = 48;
  }
  return trits(ld_u32(blk + byte), n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u);
}

// TQ1_0 (54 bytes, 2-byte aligned): 48 bytes of five trits, 4 bytes of four, f16 d at 52.
struct BtTQ1_0 : EightPerLaneCols {
  static constexpr int kBytes = 54;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    ternary_values(tq1_run(blk, 8 * lane), tq1_run(blk, 8 * lane + 4), load_half(blk + 52), w);
  }
};

// TQ2_0 (66 bytes, 2-byte aligned): 64 bytes of four 2-bit values (column 128c + 32s + j: bits 2s
// of byte 32c + j), f16 d at 64.
struct BtTQ2_0 : EightPerLaneCols {
  static constexpr int kBytes = 66;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int c = lane >> 4, s = (lane >> 2) & 3, j = 8 * (lane & 3);
    const uint32_t lo = ld_u32(blk + 32 * c + j), hi = ld_u32(blk + 32 * c + j + 4);
    ternary_values((lo >> (2 * s)) & 0x03030303u, (hi >> (2 * s)) & 0x03030303u,
                   load_half(blk + 64), w);
  }
};

// This file's types (MOE_GGML_CASE, ggml_codec.cuh).
struct IquantTypes {
  template <class F>
  static bool with(GgmlType t, F&& f) {
    switch (t) {
      MOE_GGML_CASE(IQ2_XXS)
      MOE_GGML_CASE(IQ2_XS)
      MOE_GGML_CASE(IQ2_S)
      MOE_GGML_CASE(IQ3_XXS)
      MOE_GGML_CASE(IQ3_S)
      MOE_GGML_CASE(IQ1_S)
      MOE_GGML_CASE(IQ1_M)
      MOE_GGML_CASE(TQ1_0)
      MOE_GGML_CASE(TQ2_0)
      default: return false;
    }
  }
};

}  // namespace

bool gemm_ggml_iquant_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s) {
  return launch_ggml_family_gemm<IquantTypes>(t, a, n_groups, max_rows_per_group, s);
}

bool dequantize_rows_ggml_iquant_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  return launch_ggml_family_dequantize<IquantTypes>(t, a, s);
}

}  // namespace moestream::gpu
