// Grouped expert GEMM for q4 rows (loader/format/expert_file.h: per row nb f16 scales, then nb*16 bytes;
// byte j of a block holds element j low, j+16 high): a lane takes 4 bytes, 8 weights, per step.
#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {
namespace {

// kAligned: rows (nb*18 bytes) and their quants start 4-byte aligned (nb even). Branch-free
// loads, as in expert_gemm_q8.cu.
template <bool kAligned>
struct Q4Codec {
  static constexpr int kElems = 8;  // elements j..j+3 (low nibbles) and j+16..j+19 (high)
  const uint8_t* m;
  int nb;
  size_t row_bytes;

  __device__ Q4Codec(const uint8_t* matrix, int cols)
      : m(matrix), nb(cols / 32), row_bytes(size_t(cols / 32) * 18) {}
  // A warp step covers 8 blocks (256 columns, 128 quant bytes per row).
  __device__ int steps() const { return (nb + 7) / 8; }
  __device__ void load_w(int row, int st, int lane, float* w) const {
    const int b = st * 8 + (lane >> 2), j = (lane & 3) * 4;
    const bool valid = b < nb;
    const int bc = valid ? b : nb - 1;
    const uint8_t* r = m + size_t(row) * row_bytes;
    const float d_raw = load_half(r + 2 * bc);  // unconditional: no branch around loads
    const float d = valid ? d_raw : 0.f;
    const uint32_t q = load_u32(r + 2 * size_t(nb) + size_t(bc) * 16 + j, kAligned);
    // Nibbles as bytes, to floats by byte_minus (no int-to-float converter): the same values.
    const uint32_t lo = q & 0x0f0f0f0fu, hi = (q >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      w[e] = byte_minus(lo, e, 8.0f) * d;
      w[4 + e] = byte_minus(hi, e, 8.0f) * d;
    }
  }
  __device__ void load_x(const float* xrow, int st, int lane, float* x) const {
    const int b = st * 8 + (lane >> 2), j = (lane & 3) * 4;
    const bool valid = b < nb;
    const float* xb = xrow + (valid ? b : nb - 1) * 32 + j;
    load_x4(xb, valid, x);
    load_x4(xb + 16, valid, x + 4);
  }
  __device__ void store(float* out, int st, int lane, const float* w) const {
    const int b = st * 8 + (lane >> 2), j = (lane & 3) * 4;
    if (b >= nb) return;
    float* ob = out + b * 32 + j;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ob[e] = w[e];
      ob[16 + e] = w[4 + e];
    }
  }
};

}  // namespace

void dequantize_rows_q4_cuda(const DequantArgs& a, cudaStream_t s) {
  MOE_ASSERT(a.w && a.ids && a.out && a.n > 0 && a.cols > 0 && a.cols % 32 == 0,
             "dequantize_rows_q4_cuda: bad arguments");
  if ((a.cols / 32) % 2 == 0 && reinterpret_cast<uintptr_t>(a.w) % 4 == 0)
    launch_dequantize_rows<Q4Codec<true>>(a, "launch of dequantize_rows_kernel<q4>", s);
  else
    launch_dequantize_rows<Q4Codec<false>>(a, "launch of dequantize_rows_kernel<q4, 2-byte>", s);
}

void expert_gemm_q4_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && a.cols % 32 == 0 && n_groups > 0 && max_rows_per_group > 0 &&
                 a.matrix_offset % 4 == 0,
             "expert_gemm_q4_cuda: bad arguments");
  if ((a.cols / 32) % 2 == 0)
    launch_expert_gemm<Q4Codec<true>>(a, n_groups, max_rows_per_group,
                                      "launch of expert_gemm_kernel<q4>", s);
  else
    launch_expert_gemm<Q4Codec<false>>(a, n_groups, max_rows_per_group,
                                       "launch of expert_gemm_kernel<q4, 2-byte aligned>", s);
}

}  // namespace moestream::gpu
