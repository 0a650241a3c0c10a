// Grouped expert GEMM for q8 rows (loader/format/expert_file.h: per row nb f16 scales, then nb*32 int8
// quants): a lane dequantises 4 consecutive quants (one 32-bit load) per row and step.
#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {
namespace {

// kAligned: rows (nb*34 bytes) and their quants start 4-byte aligned (nb even, as every model's
// widths give); otherwise each 32-bit quant load is assembled from two 16-bit loads.
// Loads are branch-free (a lane past the row reads the row's last block and zeroes it), so the
// compiler can issue every row's loads of a step back to back.
template <bool kAligned>
struct Q8Codec {
  static constexpr int kElems = 4;
  const uint8_t* m;
  int nb;
  size_t row_bytes;

  __device__ Q8Codec(const uint8_t* matrix, int cols)
      : m(matrix), nb(cols / 32), row_bytes(size_t(cols / 32) * 34) {}
  // A warp step covers 4 blocks (128 columns, 128 quant bytes: one coalesced segment per row).
  __device__ int steps() const { return (nb + 3) / 4; }
  __device__ void load_w(int row, int st, int lane, float* w) const {
    const int quad = st * 32 + lane, b = quad >> 3;
    const bool valid = b < nb;
    const int qc = valid ? quad : nb * 8 - 1;
    const uint8_t* r = m + size_t(row) * row_bytes;
    const float d_raw = load_half(r + 2 * (qc >> 3));  // unconditional: no branch around loads
    const float d = valid ? d_raw : 0.f;
    const uint32_t q = load_u32(r + 2 * size_t(nb) + size_t(qc) * 4, kAligned);
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = d * sbyte(q, e);  // no int-to-float converter: same values
  }
  __device__ void load_x(const float* xrow, int st, int lane, float* x) const {
    const int quad = st * 32 + lane;
    const bool valid = (quad >> 3) < nb;
    load_x4(xrow + size_t(valid ? quad : nb * 8 - 1) * 4, valid, x);
  }
  __device__ void store(float* out, int st, int lane, const float* w) const {
    const int quad = st * 32 + lane;
    if ((quad >> 3) >= nb) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) out[quad * 4 + e] = w[e];
  }
};

}  // namespace

void dequantize_rows_q8_cuda(const DequantArgs& a, cudaStream_t s) {
  MOE_ASSERT(a.w && a.ids && a.out && a.n > 0 && a.cols > 0 && a.cols % 32 == 0,
             "dequantize_rows_q8_cuda: bad arguments");
  if ((a.cols / 32) % 2 == 0 && reinterpret_cast<uintptr_t>(a.w) % 4 == 0)
    launch_dequantize_rows<Q8Codec<true>>(a, "launch of dequantize_rows_kernel<q8>", s);
  else
    launch_dequantize_rows<Q8Codec<false>>(a, "launch of dequantize_rows_kernel<q8, 2-byte>", s);
}

void expert_gemm_q8_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && a.cols % 32 == 0 && n_groups > 0 && max_rows_per_group > 0 &&
                 a.matrix_offset % 4 == 0,
             "expert_gemm_q8_cuda: bad arguments");
  if ((a.cols / 32) % 2 == 0)
    launch_expert_gemm<Q8Codec<true>>(a, n_groups, max_rows_per_group,
                                      "launch of expert_gemm_kernel<q8>", s);
  else
    launch_expert_gemm<Q8Codec<false>>(a, n_groups, max_rows_per_group,
                                       "launch of expert_gemm_kernel<q8, 2-byte aligned>", s);
}

}  // namespace moestream::gpu
