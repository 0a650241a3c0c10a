// Fused SwiGLU on the GPU: out = silu(gate) * up, the step between an expert's gate/up and down
// matvecs. Reference: the loop in runtime/model/moe_layer.cpp.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 256;

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              size_t n, float* __restrict__ out) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];  // expf, not __expf: stay within 2 ulp of the CPU
  }
}

}  // namespace

void swiglu_cuda(const float* gate, const float* up, size_t n, float* out, cudaStream_t s) {
  MOE_ASSERT(gate && up && out && n > 0, "swiglu_cuda: null pointer or empty shape");
  const unsigned blocks = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 65535));
  swiglu_kernel<<<blocks, kThreads, 0, s>>>(gate, up, n, out);
  MOE_CUDA_CHECK_LAUNCH("swiglu_kernel");
}

void swiglu(const float* gate, const float* up, size_t n, float* out, Stream s) {
  if (n == 0) throw Error("gpu::swiglu: empty input (n=0)");
  if (!gate || !up || !out) throw Error("gpu::swiglu: null device pointer");
  swiglu_cuda(gate, up, n, out, s);
}

}  // namespace moestream::gpu
