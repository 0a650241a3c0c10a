// ggml's 32-element block types on the GPU (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) and
// NVFP4's 64-element blocks: the block decoders of the GgmlCodec tile loop (ggml_codec.cuh). Four
// lanes share a 32-element block; lane sub takes columns 4*sub..4*sub+3 and 16+4*sub..16+4*sub+3,
// i.e. the low and high nibbles of quant bytes 4*sub..4*sub+3 in the nibble types (element j low,
// j+16 high, as gguf stores them).
#include "loader/format/ggml_nvfp4.h"
#include "kernels/cuda/ggml_codec.cuh"

namespace moestream::gpu {
namespace {

struct LegacyCols {
  static constexpr int kBlockElems = 32;
  static constexpr int kLanes = 4;
  __device__ static void cols(int sub, int& a, int& b) {
    a = 4 * sub;
    b = 16 + 4 * sub;
  }
};

// The low and high nibbles of a quant word, one per byte.
__device__ __forceinline__ uint32_t low_nibbles(uint32_t q) { return q & 0x0f0f0f0fu; }
__device__ __forceinline__ uint32_t high_nibbles(uint32_t q) { return (q >> 4) & 0x0f0f0f0fu; }

// Bits 0..3 of x to bit 4 of bytes 0..3 (the Q5 types' fifth bits of 4 consecutive elements;
// the shifted copies of x do not overlap, so the product carries nothing).
__device__ __forceinline__ uint32_t fifth_bits(uint32_t x) {
  return (((x & 0xfu) * 0x00204081u) & 0x01010101u) << 4;
}

// w[e] = d * (byte e of lo - bias), w[4+e] = the same of hi.
__device__ __forceinline__ void scale_bytes(uint32_t lo, uint32_t hi, float d, float bias,
                                            float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fmul_rn(d, byte_minus(lo, e, bias));
    w[4 + e] = __fmul_rn(d, byte_minus(hi, e, bias));
  }
}
// The types with a minimum: w = d * byte + m.
__device__ __forceinline__ void scale_bytes_min(uint32_t lo, uint32_t hi, float d, float m,
                                                float* w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    w[e] = __fadd_rn(__fmul_rn(d, byte_minus(lo, e, 0.0f)), m);
    w[4 + e] = __fadd_rn(__fmul_rn(d, byte_minus(hi, e, 0.0f)), m);
  }
}

// Q4_0 (18 bytes): f16 d, 16 bytes of nibbles; x = d * (q - 8).
struct BtQ4_0 : LegacyCols {
  static constexpr int kBytes = 18;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    const float d = load_half(blk);
    const uint32_t q = ld_u32(blk + 2 + 4 * sub);
    scale_bytes(low_nibbles(q), high_nibbles(q), d, 8.0f, w);
  }
};

// Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; x = d * q + m.
struct BtQ4_1 : LegacyCols {
  static constexpr int kBytes = 20;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    const uint32_t dm = ld_u32_aligned(blk);
    const float d = half_bits(dm & 0xffffu), m = half_bits(dm >> 16);
    const uint32_t q = ld_u32_aligned(blk + 4 + 4 * sub);
    scale_bytes_min(low_nibbles(q), high_nibbles(q), d, m, w);
  }
};

// Q5_0 (22 bytes): f16 d, 32-bit qh (bit j: bit 4 of element j), 16 bytes of low nibbles;
// x = d * (q - 16).
struct BtQ5_0 : LegacyCols {
  static constexpr int kBytes = 22;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    const float d = load_half(blk);
    const uint32_t qh = ld_u32(blk + 2), q = ld_u32(blk + 6 + 4 * sub);
    scale_bytes(low_nibbles(q) | fifth_bits(qh >> (4 * sub)),
                high_nibbles(q) | fifth_bits(qh >> (16 + 4 * sub)), d, 16.0f, w);
  }
};

// Q5_1 (24 bytes): f16 d, f16 m, 32-bit qh, 16 bytes of low nibbles; x = d * q + m.
struct BtQ5_1 : LegacyCols {
  static constexpr int kBytes = 24;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    const uint32_t dm = ld_u32_aligned(blk);
    const float d = half_bits(dm & 0xffffu), m = half_bits(dm >> 16);
    const uint32_t qh = ld_u32_aligned(blk + 4), q = ld_u32_aligned(blk + 8 + 4 * sub);
    scale_bytes_min(low_nibbles(q) | fifth_bits(qh >> (4 * sub)),
                    high_nibbles(q) | fifth_bits(qh >> (16 + 4 * sub)), d, m, w);
  }
};

// Q8_0 (34 bytes): f16 d, 32 int8; x = d * q.
struct BtQ8_0 : LegacyCols {
  static constexpr int kBytes = 34;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    const float d = load_half(blk);
    const uint32_t lo = ld_u32(blk + 2 + 4 * sub), hi = ld_u32(blk + 18 + 4 * sub);
    scale_bytes(lo ^ 0x80808080u, hi ^ 0x80808080u, d, 128.0f, w);  // int8 b -> b + 128
  }
};

// Code-book types: x = scale * book[nibble], the 16 int8 entries packed 4 per word (ggml's
// constants: IQ4_NL's non-linear levels; MXFP4's E2M1 values doubled so that all are integers).
__device__ __forceinline__ void book_decode(uint32_t q, float scale, uint32_t t0, uint32_t t1,
                                            uint32_t t2, uint32_t t3, float* w) {
  const uint32_t lo = lut16x4(low_nibbles(q), t0, t1, t2, t3);
  const uint32_t hi = lut16x4(high_nibbles(q), t0, t1, t2, t3);
  scale_bytes(lo ^ 0x80808080u, hi ^ 0x80808080u, scale, 128.0f, w);  // int8 b -> b + 128
}

// IQ4_NL (18 bytes): f16 d, 16 bytes of code-book nibbles
// {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}.
struct BtIQ4_NL : LegacyCols {
  static constexpr int kBytes = 18;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    book_decode(ld_u32(blk + 2 + 4 * sub), load_half(blk), 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u,
                0x71594535u, w);
  }
};

// E8M0 exponent e as half its value, 2^(e-128) (the book holds doubled values); e = 0 and 1 give
// subnormal floats, which the GPU keeps (no flush to zero in this build).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? (0x00200000u << e) : (e - 1) << 23);
}

// MXFP4 (17 bytes): E8M0 scale byte, 16 bytes of E2M1 nibbles
// {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} (doubled). Any byte alignment.
struct BtMXFP4 : LegacyCols {
  static constexpr int kBytes = 17;
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    book_decode(ld_u32(blk + 1 + 4 * sub), e8m0_half(__ldg(blk)), 0x03020100u, 0x0C080604u,
                0xFDFEFF00u, 0xF4F8FAFCu, w);
  }
};

// NVFP4's UE4M3 scales as half their value: the format's table (loader/format/ggml_nvfp4.h),
// copied at compile time; in global memory, as lanes read different entries.
__device__ const detail::Nvfp4HalfScales kNvfp4HalfScalesGpu = detail::kNvfp4HalfScales;

// NVFP4 (36 bytes, 4-byte aligned): 4 UE4M3 scale bytes (one per 16 columns), 32 bytes of E2M1
// nibbles; sub-block s is bytes 4 + 8s..+7, element j the low nibble of byte j, 8 + j the high
// one. Eight lanes share a block: lane sub takes sub-block s = sub / 2, columns 16s + 4h..+3 (low
// nibbles of bytes 4 + 4*sub..+3, h = sub % 2) and 16s + 8 + 4h..+3 (their high nibbles). The
// value is (scale / 2) * doubled E2M1 value, exact as on the CPU.
struct BtNVFP4 {
  static constexpr int kBlockElems = 64;
  static constexpr int kLanes = 8;
  static constexpr int kBytes = 36;
  __device__ static void cols(int sub, int& a, int& b) {
    a = 16 * (sub >> 1) + 4 * (sub & 1);
    b = a + 8;
  }
  __device__ static void decode(const uint8_t* blk, int sub, float* w) {
    book_decode(ld_u32_aligned(blk + 4 + 4 * sub), __ldg(&kNvfp4HalfScalesGpu.v[__ldg(blk + (sub >> 1))]),
                0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu, w);
  }
};

// This file's types (MOE_GGML_CASE, ggml_codec.cuh).
struct LegacyTypes {
  template <class F>
  static bool with(GgmlType t, F&& f) {
    switch (t) {
      MOE_GGML_CASE(Q4_0)
      MOE_GGML_CASE(Q4_1)
      MOE_GGML_CASE(Q5_0)
      MOE_GGML_CASE(Q5_1)
      MOE_GGML_CASE(Q8_0)
      MOE_GGML_CASE(IQ4_NL)
      MOE_GGML_CASE(MXFP4)
      MOE_GGML_CASE(NVFP4)
      default: return false;
    }
  }
};

}  // namespace

bool gemm_ggml_legacy_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s) {
  return launch_ggml_family_gemm<LegacyTypes>(t, a, n_groups, max_rows_per_group, s);
}

bool dequantize_rows_ggml_legacy_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  return launch_ggml_family_dequantize<LegacyTypes>(t, a, s);
}

}  // namespace moestream::gpu
