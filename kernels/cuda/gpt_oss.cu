// gpt-oss's kernels beside the common ones: the router that takes the softmax over the selected
// top-k logits, the clamped SwiGLU, and the per-expert biases added to grouped expert rows.
// References: runtime/model/routing.cpp route_token_topk_softmax and clamped_swiglu.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/router_select.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kMaxExperts = 8192;  // taken flags in shared memory
constexpr int kMaxK = 64;          // selected logits kept in registers of lane 0
constexpr int kThreads = 256;

// One warp per token: the k largest logits by selection (ties: lower id first), then the softmax
// over those k in selection order, as the CPU.
__global__ void router_topk_softmax_kernel(const float* __restrict__ logits, int n_experts, int k,
                                           int* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ unsigned char taken[];
  const float* l = logits + size_t(blockIdx.x) * n_experts;
  const int lane = threadIdx.x;
  for (int e = lane; e < n_experts; e += 32) taken[e] = 0;
  __syncwarp();
  int* out_ids = ids + size_t(blockIdx.x) * k;
  float* out_w = weights + size_t(blockIdx.x) * k;
  float sel[kMaxK];
  for (int j = 0; j < k; ++j) {
    float bv;
    const int best = warp_pick_best(l, taken, nullptr, 1, n_experts, lane, &bv);
    if (lane == 0) {
      out_ids[j] = best;
      taken[best] = 1;
    }
    sel[j] = bv;
    __syncwarp();
  }
  if (lane == 0) {
    const float m = sel[0];  // the largest
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += sel[j] = expf(sel[j] - m);
    for (int j = 0; j < k; ++j) out_w[j] = sel[j] / sum;
  }
}

__global__ void swiglu_clamped_kernel(const float* __restrict__ gate, const float* __restrict__ up, size_t n,
                                      float limit, float alpha, float* __restrict__ out) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
    out[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));  // the CPU's order of operations
  }
}

// One block per row r of [r0, r1): its group g (row_start[g] <= r < row_start[g + 1], g in
// [g0, g1)) by binary search, then y[r] += the float32 bias at payload[g] + bias_offset.
__global__ void expert_bias_add_kernel(float* __restrict__ y, int dim, const int* __restrict__ row_start, int g0,
                                       int g1, int r0, const uint8_t* const* __restrict__ payloads,
                                       size_t bias_offset) {
  const int r = r0 + int(blockIdx.x);
  int lo = g0, hi = g1 - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (row_start[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  const float* b = reinterpret_cast<const float*>(payloads[lo] + bias_offset);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) y[size_t(r) * dim + c] += b[c];
}

}  // namespace

void router_topk_softmax(const float* logits, int n_tokens, int n_experts, int k, int* ids, float* weights,
                         Stream s) {
  if (n_tokens <= 0 || n_experts <= 0 || n_experts > kMaxExperts || k <= 0 || k > n_experts || k > kMaxK)
    throw Error("gpu::router_topk_softmax: bad shape n_tokens=" + std::to_string(n_tokens) +
                " n_experts=" + std::to_string(n_experts) + " k=" + std::to_string(k) + " (k at most " +
                std::to_string(kMaxK) + ")");
  if (!logits || !ids || !weights) throw Error("gpu::router_topk_softmax: null device pointer");
  router_topk_softmax_kernel<<<n_tokens, 32, size_t(n_experts), s>>>(logits, n_experts, k, ids, weights);
  MOE_CUDA_CHECK_LAUNCH("router_topk_softmax_kernel");
}

void swiglu_clamped(const float* gate, const float* up, size_t n, float limit, float alpha, float* out, Stream s) {
  if (n == 0) throw Error("gpu::swiglu_clamped: empty input (n=0)");
  if (!gate || !up || !out) throw Error("gpu::swiglu_clamped: null device pointer");
  if (!(limit > 0)) throw Error("gpu::swiglu_clamped: limit must be positive");
  const unsigned blocks = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 65535));
  swiglu_clamped_kernel<<<blocks, kThreads, 0, s>>>(gate, up, n, limit, alpha, out);
  MOE_CUDA_CHECK_LAUNCH("swiglu_clamped_kernel");
}

void expert_bias_add(float* y, int dim, const int* row_start, int g0, int g1, int r0, int r1,
                     const uint8_t* const* payloads, size_t bias_offset, Stream s) {
  if (dim <= 0 || g0 < 0 || g1 <= g0 || r0 < 0 || r1 < r0)
    throw Error("gpu::expert_bias_add: bad shape dim=" + std::to_string(dim) + " groups [" + std::to_string(g0) +
                ", " + std::to_string(g1) + ") rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ")");
  if (!y || !row_start || !payloads) throw Error("gpu::expert_bias_add: null device pointer");
  if (bias_offset % 4 != 0) throw Error("gpu::expert_bias_add: bias offset not float-aligned");
  if (r1 == r0) return;
  expert_bias_add_kernel<<<unsigned(r1 - r0), 128, 0, s>>>(y, dim, row_start, g0, g1, r0, payloads, bias_offset);
  MOE_CUDA_CHECK_LAUNCH("expert_bias_add_kernel");
}

}  // namespace moestream::gpu
