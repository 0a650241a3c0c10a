// Internal to kernels/: the tile-loop codec of ggml's block types (loader/format/ggml_types.h,
// layouts in docs/format.md), shared by expert_gemm_ggml_{legacy,kquants,iquants}.cu. A block type BT
// says how one lane decodes 8 weights of a block; GgmlCodec<BT> maps a warp step onto blocks and
// serves expert_gemm, dense_gemm and dequantize_rows alike.
//
// Every step covers 256 columns: 8 blocks of 32 (4 lanes per block), 4 NVFP4 blocks of 64 (8
// lanes) or one super-block of 256 (32 lanes). A lane's 8 weights are two runs of 4 consecutive columns (BT::cols), so its
// activations are two float4 loads. Weights round as the CPU reference (kernels/cpu/
// ggml_{legacy,kquants}.cpp) does, each product and sum on its own (__fmul_rn, __fadd_rn: no
// contraction into a fused multiply-add), so dequantize_rows equals ggml_dequantize_row bit for
// bit.
//
// Alignment: matrices start 16-byte aligned (dense_gemm/dequantize_rows check it; expert payloads
// and matrix offsets are 64-aligned), but a block of 18, 22, 34, 110, 210 or 17 bytes (or the
// lattice and ternary types' 50, 54, 66, 74, 82, 98) starts only 2- or 1-byte aligned; those
// types load words with ld_u32 (two aligned loads and a funnel shift). Types with 4-byte-multiple
// blocks (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, IQ4_XS, IQ1_M, NVFP4) load aligned words.
#pragma once

#include <cuda_fp16.h>

#include <string>

#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {

__device__ __forceinline__ uint32_t ld_u32_aligned(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// 4 bytes at any address, little-endian. Reads only the aligned words that hold them (the second
// word only when the bytes straddle two): never a word that holds no byte of the matrix, so at
// most 3 bytes past its end, inside the allocation's granularity (cudaMalloc: 256 bytes).
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const auto* w = reinterpret_cast<const unsigned int*>(a & ~uintptr_t{3});
  const uint32_t shift = uint32_t(a & 3) * 8;
  const uint32_t lo = __ldg(w), hi = __ldg(w + (shift != 0));
  return __funnelshift_r(lo, hi, shift);
}

__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__half(__half_raw{static_cast<unsigned short>(h)}));
}

// Four 16-entry int8 code-book lookups at once: v holds an index 0..15 in each byte; t0..t3 the
// table's 16 bytes (t0 entries 0-3, ..., t3 entries 12-15). Returns the 4 entries as bytes.
__device__ __forceinline__ uint32_t lut16x4(uint32_t v, uint32_t t0, uint32_t t1, uint32_t t2,
                                            uint32_t t3) {
  // Selector nibbles: index k to bits 4k..4k+3 (bytes 0 and 2 of v | v >> 4 hold two each).
  const uint32_t sel = __byte_perm(v | (v >> 4), 0, 0x4420) & 0x7777u;
  const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
  const uint32_t upper = ((v >> 3) & 0x01010101u) * 0xffu;  // bytes whose index is >= 8
  return (hi & upper) | (lo & ~upper);
}

// A lane's 8 weights of ggml block type BT, with BT providing: kBlockElems (32 or 256), kBytes,
// kLanes (lanes per block: 4 or 32), cols(sub, a, b) (the lane's runs [a, a+4) and [b, b+4) inside
// the block, sub = the lane's index among the block's lanes) and decode(block, sub, w[8]).
template <class BT>
struct GgmlCodec {
  static constexpr int kElems = 8;
  static constexpr int kBlocksPerStep = 32 / BT::kLanes;
  const uint8_t* m;
  int nb;
  size_t row_bytes;

  __device__ GgmlCodec(const uint8_t* matrix, int cols)
      : m(matrix),
        nb(cols / BT::kBlockElems),
        row_bytes(size_t(cols / BT::kBlockElems) * BT::kBytes) {}
  __device__ int steps() const { return (nb + kBlocksPerStep - 1) / kBlocksPerStep; }
  // Branch-free: a lane past the row decodes the row's last block and zeroes it.
  __device__ void load_w(int row, int st, int lane, float* w) const {
    const int b = st * kBlocksPerStep + lane / BT::kLanes;
    const bool valid = b < nb;
    BT::decode(m + size_t(row) * row_bytes + size_t(valid ? b : nb - 1) * BT::kBytes,
               lane % BT::kLanes, w);
#pragma unroll
    for (int e = 0; e < kElems; ++e) w[e] = valid ? w[e] : 0.f;
  }
  __device__ void load_x(const float* xrow, int st, int lane, float* x) const {
    const int b = st * kBlocksPerStep + lane / BT::kLanes;
    const bool valid = b < nb;
    int c0, c1;
    BT::cols(lane % BT::kLanes, c0, c1);
    const float* xb = xrow + size_t(valid ? b : nb - 1) * BT::kBlockElems;
    load_x4(xb + c0, valid, x);
    load_x4(xb + c1, valid, x + 4);
  }
  __device__ void store(float* out, int st, int lane, const float* w) const {
    const int b = st * kBlocksPerStep + lane / BT::kLanes;
    if (b >= nb) return;
    int c0, c1;
    BT::cols(lane % BT::kLanes, c0, c1);
    float* ob = out + size_t(b) * BT::kBlockElems;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ob[c0 + e] = w[e];
      ob[c1 + e] = w[4 + e];
    }
  }
};

template <class BT>
void launch_ggml_gemm(const GemmArgs& a, int n_groups, int max_rows, const char* name,
                      cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && a.cols % BT::kBlockElems == 0 && n_groups > 0 && max_rows > 0 &&
                 a.matrix_offset % 16 == 0 && reinterpret_cast<uintptr_t>(a.matrix) % 16 == 0,
             std::string("bad arguments to ") + name);
  launch_expert_gemm<GgmlCodec<BT>>(a, n_groups, max_rows, name, s);
}

template <class BT>
void launch_ggml_dequantize(const DequantArgs& a, const char* name, cudaStream_t s) {
  MOE_ASSERT(a.w && a.ids && a.out && a.n > 0 && a.cols > 0 && a.cols % BT::kBlockElems == 0 &&
                 reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
             std::string("bad arguments to ") + name);
  launch_dequantize_rows<GgmlCodec<BT>>(a, name, s);
}

// A case of a family's type switch (Family::with(t, f), one per .cu file): calls
// f(BT{}, gemm launch name, dequantize launch name) for the block type BtT of ggml type T.
#define MOE_GGML_CASE(T)                                              \
  case GgmlType::k##T:                                                \
    f(Bt##T{}, "launch of expert_gemm_kernel<" #T ">",                \
      "launch of dequantize_rows_kernel<" #T ">");                    \
    return true;

// The launchers of a family of block types: Family::with(t, f) calls f as above for t's block
// type and returns true, or returns false when t is not one of the family's types.
template <class Family>
bool launch_ggml_family_gemm(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                             cudaStream_t s) {
  return Family::with(t, [&](auto bt, const char* gemm_name, const char*) {
    launch_ggml_gemm<decltype(bt)>(a, n_groups, max_rows_per_group, gemm_name, s);
  });
}

template <class Family>
bool launch_ggml_family_dequantize(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  return Family::with(t, [&](auto bt, const char*, const char* dequantize_name) {
    launch_ggml_dequantize<decltype(bt)>(a, dequantize_name, s);
  });
}

}  // namespace moestream::gpu
