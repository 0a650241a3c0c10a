// Grouped expert GEMM for bf16 rows (loader/format/expert_file.h: R*C bfloat16, the upper half of a
// float32): V consecutive weights per lane and step, V = 4 (8-byte loads) when cols % 4 == 0.
#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {
namespace {

template <int V>
struct Bf16Codec : ConsecutiveColumns<V> {
  static constexpr int kElems = V;
  using ConsecutiveColumns<V>::cols;
  const uint16_t* m;

  __device__ Bf16Codec(const uint8_t* matrix, int c)
      : ConsecutiveColumns<V>{c}, m(reinterpret_cast<const uint16_t*>(matrix)) {}
  __device__ int steps() const { return (cols + 32 * V - 1) / (32 * V); }
  // Branch-free: a lane past the row reads the row's first weights and zeroes them.
  __device__ void load_w(int row, int st, int lane, float* w) const {
    const int c = (st * 32 + lane) * V;
    const bool valid = c < cols;
    const uint16_t* r = m + size_t(row) * cols + (valid ? c : 0);
    if constexpr (V == 4) {  // cols % 4 == 0: the lane's 4 weights are all in or all out
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(r));
      w[0] = valid ? __uint_as_float(u.x << 16) : 0.f;
      w[1] = valid ? __uint_as_float(u.x & 0xffff0000u) : 0.f;
      w[2] = valid ? __uint_as_float(u.y << 16) : 0.f;
      w[3] = valid ? __uint_as_float(u.y & 0xffff0000u) : 0.f;
    } else {
      const uint16_t u = __ldg(r);
      w[0] = valid ? __uint_as_float(uint32_t(u) << 16) : 0.f;
    }
  }
};

}  // namespace

void dequantize_rows_bf16_cuda(const DequantArgs& a, cudaStream_t s) {
  MOE_ASSERT(a.w && a.ids && a.out && a.n > 0 && a.cols > 0 &&
                 reinterpret_cast<uintptr_t>(a.w) % 2 == 0,
             "dequantize_rows_bf16_cuda: bad arguments");
  if (a.cols % 4 == 0 && reinterpret_cast<uintptr_t>(a.w) % 8 == 0)
    launch_dequantize_rows<Bf16Codec<4>>(a, "launch of dequantize_rows_kernel<bf16x4>", s);
  else
    launch_dequantize_rows<Bf16Codec<1>>(a, "launch of dequantize_rows_kernel<bf16>", s);
}

void expert_gemm_bf16_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && n_groups > 0 && max_rows_per_group > 0 &&
                 a.matrix_offset % 2 == 0,
             "expert_gemm_bf16_cuda: bad arguments");
  if (a.cols % 4 == 0 && a.matrix_offset % 8 == 0)
    launch_expert_gemm<Bf16Codec<4>>(a, n_groups, max_rows_per_group,
                                     "launch of expert_gemm_kernel<bf16x4>", s);
  else
    launch_expert_gemm<Bf16Codec<1>>(a, n_groups, max_rows_per_group,
                                     "launch of expert_gemm_kernel<bf16>", s);
}

}  // namespace moestream::gpu
