// ggml's 256-element super-block types on the GPU (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS): the
// block decoders of the GgmlCodec tile loop (ggml_codec.cuh). A warp takes one super-block per
// step, each lane 8 columns whose quant bits lie in one 4-byte word per array. Values round as
// kernels/cpu/ggml_kquants.cpp: (d * scale) * q - (dmin * min), each step on its own.
#include "kernels/cuda/ggml_codec.cuh"

namespace moestream::gpu {
namespace {

// Byte i (0..3) of a word.
__device__ __forceinline__ uint32_t byte_of(uint32_t v, int i) { return (v >> (8 * i)) & 0xffu; }

// A lane's 8 weights from two words of per-byte levels (byte e of lo: column run 1, of hi: run
// 2) minus `bias`: dl * q, or dl * q - ml for the types with a minimum, where dl = d * scale and
// ml = dmin * min of each run's 16-column sub-block (+0 for the types without, so that
// dl * q - (+0) is dl * q bit for bit, as the CPU computes it).
__device__ __forceinline__ void kquant_values(uint32_t lo, uint32_t hi, float bias, float dl0,
                                              float ml0, float dl1, float ml1, float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fsub_rn(__fmul_rn(dl0, byte_minus(lo, e, bias)), ml0);
    w[4 + e] = __fsub_rn(__fmul_rn(dl1, byte_minus(hi, e, bias)), ml1);
  }
}
__device__ __forceinline__ void kquant_values(uint32_t lo, uint32_t hi, float bias, float dl0,
                                              float dl1, float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fmul_rn(dl0, byte_minus(lo, e, bias));
    w[4 + e] = __fmul_rn(dl1, byte_minus(hi, e, bias));
  }
}

// Q2_K and Q3_K: 128-column halves h; quant byte h*32 + j holds columns h*128 + s*32 + j for
// s = 0..3 (2 bits each, bits 2s). Lane: h = lane / 16, s in {sp, sp + 2} with sp = (lane / 8) % 2,
// j = 4 * (lane % 8): columns [h*128 + sp*32 + j, +4) and [h*128 + (sp+2)*32 + j, +4).
struct TwoBitCols {
  static constexpr int kBlockElems = 256;
  static constexpr int kLanes = 32;
  __device__ static void cols(int lane, int& a, int& b) {
    const int h = lane >> 4, sp = (lane >> 3) & 1, j = (lane & 7) * 4;
    a = h * 128 + sp * 32 + j;
    b = a + 64;
  }
};

// Q2_K (84 bytes): 16 bytes of 4-bit scale (low) / min (high) per 16 columns, 64 bytes of 2-bit
// quants, f16 d, f16 dmin.
struct BtQ2_K : TwoBitCols {
  static constexpr int kBytes = 84;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int h = lane >> 4, sp = (lane >> 3) & 1, j = (lane & 7) * 4;
    const uint32_t dd = ld_u32_aligned(blk + 80);
    const float d = half_bits(dd & 0xffffu), dmin = half_bits(dd >> 16);
    const uint32_t q = ld_u32_aligned(blk + 16 + h * 32 + j);
    const int k = h * 8 + sp * 2 + (j >> 4);  // scale index of the first run; +4 for the second
    const uint32_t sm0 = __ldg(blk + k), sm1 = __ldg(blk + k + 4);
    kquant_values((q >> (2 * sp)) & 0x03030303u, (q >> (2 * sp + 4)) & 0x03030303u, 0.0f,
                  __fmul_rn(d, float(sm0 & 0xf)), __fmul_rn(dmin, float(sm0 >> 4)),
                  __fmul_rn(d, float(sm1 & 0xf)), __fmul_rn(dmin, float(sm1 >> 4)), w);
  }
};

// Q3_K's 6-bit scale k (of 16), minus 32: low 4 bits from the nibbles of bytes 0-7, high 2 bits
// from bytes 8-11 (bits 2*(k/4) of byte 8 + k%4).
__device__ __forceinline__ int q3k_scale(const uint8_t* s, int k) {
  const uint32_t lo = k < 8 ? (__ldg(s + k) & 0xfu) : (__ldg(s + k - 8) >> 4);
  const uint32_t hi = (__ldg(s + 8 + (k & 3)) >> (2 * (k >> 2))) & 3u;
  return int(lo | (hi << 4)) - 32;
}

// Q3_K (110 bytes, 2-byte aligned): 32 bytes of high bits (bit 4h+s of byte j: column
// h*128 + s*32 + j; a clear bit subtracts 4), 64 bytes of 2-bit quants, 12 bytes of scales, f16 d.
struct BtQ3_K : TwoBitCols {
  static constexpr int kBytes = 110;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int h = lane >> 4, sp = (lane >> 3) & 1, j = (lane & 7) * 4;
    const float d = load_half(blk + 108);
    const uint32_t hm = ld_u32(blk + j), q = ld_u32(blk + 32 + h * 32 + j);
    const int k = h * 8 + sp * 2 + (j >> 4);
    const int sc0 = q3k_scale(blk + 96, k), sc1 = q3k_scale(blk + 96, k + 4);
    // level = low + 4 * high bit - 4: the high bit is bit 2 of the byte, the bias 4.
    const int s0 = 4 * h + sp, s1 = s0 + 2;
    const uint32_t lo = ((q >> (2 * sp)) & 0x03030303u) | (((hm >> s0) & 0x01010101u) << 2);
    const uint32_t hi = ((q >> (2 * sp + 4)) & 0x03030303u) | (((hm >> s1) & 0x01010101u) << 2);
    kquant_values(lo, hi, 4.0f, __fmul_rn(d, float(sc0)), __fmul_rn(d, float(sc1)), w);
  }
};

// Q4_K and Q5_K: 64-column chunks c; quant byte c*32 + j holds column c*64 + j (low nibble) and
// c*64 + 32 + j (high). Lane: c = lane / 8, j = 4 * (lane % 8).
struct NibbleChunkCols {
  static constexpr int kBlockElems = 256;
  static constexpr int kLanes = 32;
  __device__ static void cols(int lane, int& a, int& b) {
    a = (lane >> 3) * 64 + (lane & 7) * 4;
    b = a + 32;
  }
};

// The 6-bit scale and min of sub-block i (of 8, 32 columns each) from the 12 bytes s0..s2 (as
// words): i < 4: low 6 bits of bytes i (scale) and 4+i (min); i >= 4: the nibbles of byte i+4 for
// the low 4 bits, the top 2 bits of bytes i-4 (scale) and i (min) for the high 2.
__device__ __forceinline__ void k4_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int i,
                                             int& sc, int& mn) {
  const int i4 = i & 3;
  const uint32_t a = byte_of(s0, i4), b = byte_of(s1, i4), c = byte_of(s2, i4);
  sc = int(i < 4 ? (a & 63) : ((c & 0xf) | ((a >> 6) << 4)));
  mn = int(i < 4 ? (b & 63) : ((c >> 4) | ((b >> 6) << 4)));
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles.
// Q5_K (176 bytes): the same header, 32 bytes of fifth bits (bits 2c, 2c+1 of byte j for the low
// and high nibble of chunk c), 128 bytes of nibbles.
template <bool kQ5>
struct BtK4 : NibbleChunkCols {
  static constexpr int kBytes = kQ5 ? 176 : 144;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int c = lane >> 3, j = (lane & 7) * 4;
    const uint32_t dd = ld_u32_aligned(blk);
    const float d = half_bits(dd & 0xffffu), dmin = half_bits(dd >> 16);
    int sc0, mn0, sc1, mn1;
    const uint32_t s0 = ld_u32_aligned(blk + 4), s1 = ld_u32_aligned(blk + 8),
                   s2 = ld_u32_aligned(blk + 12);
    k4_scale_min(s0, s1, s2, 2 * c, sc0, mn0);
    k4_scale_min(s0, s1, s2, 2 * c + 1, sc1, mn1);
    const uint32_t q = ld_u32_aligned(blk + (kQ5 ? 48 : 16) + c * 32 + j);
    uint32_t lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
    if constexpr (kQ5) {
      const uint32_t qh = ld_u32_aligned(blk + 16 + j);
      lo |= ((qh >> (2 * c)) & 0x01010101u) << 4;
      hi |= ((qh >> (2 * c + 1)) & 0x01010101u) << 4;
    }
    kquant_values(lo, hi, 0.0f, __fmul_rn(d, float(sc0)), __fmul_rn(dmin, float(mn0)),
                  __fmul_rn(d, float(sc1)), __fmul_rn(dmin, float(mn1)), w);
  }
};
using BtQ4_K = BtK4<false>;
using BtQ5_K = BtK4<true>;

// Q6_K (210 bytes, 2-byte aligned): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16
// int8 scales (per 16 columns), f16 d; q = (low | high << 4) - 32. In half h, column
// h*128 + t*32 + j takes nibble t/2 of low byte h*64 + (t%2)*32 + j and bits 2t of high byte
// h*32 + j. Lane: h = lane / 16, t in {tp, tp + 2} with tp = (lane / 8) % 2, j = 4 * (lane % 8).
struct BtQ6_K : TwoBitCols {  // the same column runs as Q2_K/Q3_K
  static constexpr int kBytes = 210;
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int h = lane >> 4, tp = (lane >> 3) & 1, j = (lane & 7) * 4;
    const float d = load_half(blk + 208);
    const uint32_t ql = ld_u32(blk + h * 64 + tp * 32 + j), qh = ld_u32(blk + 128 + h * 32 + j);
    const int k = h * 8 + tp * 2 + (j >> 4);
    const int sc0 = int(int8_t(__ldg(blk + 192 + k))), sc1 = int(int8_t(__ldg(blk + 192 + k + 4)));
    const uint32_t lo = (ql & 0x0f0f0f0fu) | (((qh >> (2 * tp)) & 0x03030303u) << 4);
    const uint32_t hi = ((ql >> 4) & 0x0f0f0f0fu) | (((qh >> (2 * tp + 4)) & 0x03030303u) << 4);
    kquant_values(lo, hi, 32.0f, __fmul_rn(d, float(sc0)), __fmul_rn(d, float(sc1)), w);
  }
};

// IQ4_XS (136 bytes): f16 d, 16-bit high scale bits (2 per 32 columns), 4 bytes of low scale
// nibbles, 128 bytes of IQ4_NL code-book nibbles; 32-column sub-block sb is bytes sb*16..+15,
// element j low, j+16 high, scale ((low | high << 4) - 32).
// Lane: sb = lane / 4, j = 4 * (lane % 4).
struct BtIQ4_XS {
  static constexpr int kBlockElems = 256;
  static constexpr int kLanes = 32;
  static constexpr int kBytes = 136;
  __device__ static void cols(int lane, int& a, int& b) {
    a = (lane >> 2) * 32 + (lane & 3) * 4;
    b = a + 16;
  }
  __device__ static void decode(const uint8_t* blk, int lane, float* w) {
    const int sb = lane >> 2, j = (lane & 3) * 4;
    const uint32_t head = ld_u32_aligned(blk);
    const float d = half_bits(head & 0xffffu);
    const uint32_t lo_bits = (__ldg(blk + 4 + (sb >> 1)) >> (4 * (sb & 1))) & 0xfu;
    const int ls = int(lo_bits | (((head >> (16 + 2 * sb)) & 3u) << 4)) - 32;
    const float dl = __fmul_rn(d, float(ls));
    const uint32_t q = ld_u32_aligned(blk + 8 + sb * 16 + j);
    const uint32_t vlo =
        lut16x4(q & 0x0f0f0f0fu, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
    const uint32_t vhi =
        lut16x4((q >> 4) & 0x0f0f0f0fu, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
    // Code-book entries are int8: b -> b + 128, bias 128.
    kquant_values(vlo ^ 0x80808080u, vhi ^ 0x80808080u, 128.0f, dl, dl, w);
  }
};

// This file's types (MOE_GGML_CASE, ggml_codec.cuh).
struct KquantTypes {
  template <class F>
  static bool with(GgmlType t, F&& f) {
    switch (t) {
      MOE_GGML_CASE(Q2_K)
      MOE_GGML_CASE(Q3_K)
      MOE_GGML_CASE(Q4_K)
      MOE_GGML_CASE(Q5_K)
      MOE_GGML_CASE(Q6_K)
      MOE_GGML_CASE(IQ4_XS)
      default: return false;
    }
  }
};

}  // namespace

bool gemm_ggml_kquant_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s) {
  return launch_ggml_family_gemm<KquantTypes>(t, a, n_groups, max_rows_per_group, s);
}

bool dequantize_rows_ggml_kquant_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  return launch_ggml_family_dequantize<KquantTypes>(t, a, s);
}

}  // namespace moestream::gpu
