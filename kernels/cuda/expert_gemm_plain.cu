// The tile-loop codecs of ggml's plain float types F32 and F16 (row-major, cols elements per
// row; F32 is also the pack's f32 encoding): V consecutive weights per lane and step, V = 4
// (one 16- or 8-byte load) when cols % 4 == 0, so every row starts aligned to the load.
#include <cuda_fp16.h>

#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {
namespace {

struct F32Elem {
  using Raw = float;
  using Raw4 = float4;
  __device__ static float cvt(float v) { return v; }
};
struct F16Elem {
  using Raw = unsigned short;
  using Raw4 = ushort4;
  __device__ static float cvt(unsigned short v) { return __half2float(__half(__half_raw{v})); }
};

template <class T, int V>
struct PlainCodec : ConsecutiveColumns<V> {
  static constexpr int kElems = V;
  using ConsecutiveColumns<V>::cols;
  const typename T::Raw* m;

  __device__ PlainCodec(const uint8_t* matrix, int c)
      : ConsecutiveColumns<V>{c}, m(reinterpret_cast<const typename T::Raw*>(matrix)) {}
  __device__ int steps() const { return (cols + 32 * V - 1) / (32 * V); }
  // Branch-free: a lane past the row reads the row's first weights and zeroes them.
  __device__ void load_w(int row, int st, int lane, float* w) const {
    const int c = (st * 32 + lane) * V;
    const bool valid = c < cols;
    const typename T::Raw* r = m + size_t(row) * cols + (valid ? c : 0);
    if constexpr (V == 4) {
      const typename T::Raw4 u = __ldg(reinterpret_cast<const typename T::Raw4*>(r));
      w[0] = valid ? T::cvt(u.x) : 0.f;
      w[1] = valid ? T::cvt(u.y) : 0.f;
      w[2] = valid ? T::cvt(u.z) : 0.f;
      w[3] = valid ? T::cvt(u.w) : 0.f;
    } else {
      w[0] = valid ? T::cvt(__ldg(r)) : 0.f;
    }
  }
};

template <class T>
void gemm_plain(const GemmArgs& a, int n_groups, int max_rows, const char* name, cudaStream_t s) {
  if (a.cols % 4 == 0)
    launch_expert_gemm<PlainCodec<T, 4>>(a, n_groups, max_rows, name, s);
  else
    launch_expert_gemm<PlainCodec<T, 1>>(a, n_groups, max_rows, name, s);
}

template <class T>
void dequantize_plain(const DequantArgs& a, const char* name, cudaStream_t s) {
  if (a.cols % 4 == 0)
    launch_dequantize_rows<PlainCodec<T, 4>>(a, name, s);
  else
    launch_dequantize_rows<PlainCodec<T, 1>>(a, name, s);
}

}  // namespace

bool gemm_plain_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                     cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && n_groups > 0 && max_rows_per_group > 0 &&
                 a.matrix_offset % 16 == 0 && reinterpret_cast<uintptr_t>(a.matrix) % 16 == 0,
             "gemm_plain_cuda: bad arguments");
  switch (t) {
    case GgmlType::kF32:
      gemm_plain<F32Elem>(a, n_groups, max_rows_per_group, "launch of expert_gemm_kernel<F32>", s);
      return true;
    case GgmlType::kF16:
      gemm_plain<F16Elem>(a, n_groups, max_rows_per_group, "launch of expert_gemm_kernel<F16>", s);
      return true;
    default: return false;
  }
}

bool dequantize_rows_plain_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s) {
  MOE_ASSERT(a.w && a.ids && a.out && a.n > 0 && a.cols > 0 &&
                 reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
             "dequantize_rows_plain_cuda: bad arguments");
  switch (t) {
    case GgmlType::kF32:
      dequantize_plain<F32Elem>(a, "launch of dequantize_rows_kernel<F32>", s);
      return true;
    case GgmlType::kF16:
      dequantize_plain<F16Elem>(a, "launch of dequantize_rows_kernel<F16>", s);
      return true;
    default: return false;
  }
}

}  // namespace moestream::gpu
