// The expert matvec op dispatching on the layer's quant type, and the device probe; the
// per-encoding kernels live in expert_matvec_{q8,q4,bf16}.cu. ggml's types go through
// dense_gemm with one token: the same codecs as expert_gemm.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {

void expert_matvec(QuantType q, const uint8_t* w, int rows, int cols, const float* x, float* y,
                   Stream s) {
  switch (q) {
    case QuantType::kQ8: return expert_matvec_q8(w, rows, cols, x, y, s);
    case QuantType::kQ4: return expert_matvec_q4(w, rows, cols, x, y, s);
    case QuantType::kBF16: return expert_matvec_bf16(w, rows, cols, x, y, s);
    case QuantType::kF32: break;
  }
  // ggml's types: dense_gemm, which throws ConfigError naming a type it has no kernel for.
  if (quant_ggml_type(q)) return dense_gemm(q, w, rows, cols, x, 1, y, s);
  throw ConfigError("gpu::expert_matvec: quant type '" + std::string(quant_name(q)) +
                    "' has no GPU kernel (q8, q4, bf16 and the ggml types do)");
}

int device_count(const char** why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // reset the runtime's last-error so a later check does not report it
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (why) *why = n == 0 ? "no CUDA device" : "";
  return n;
}

}  // namespace moestream::gpu
