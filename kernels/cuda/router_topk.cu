// The MoE router on the GPU: softmax over a token's expert logits, the top-k by selection (ties:
// lower id first), optional renormalisation. Reference: runtime/model/routing.cpp route_token.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/router_select.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

// One warp per token: n_experts is 8..256 in practice and k <= 8, so a block would sit idle.
constexpr int kThreads = 32;
// 48 KiB of shared memory holds probs (4 B) + taken flags (1 B) for this many experts.
constexpr int kMaxExperts = 8192;

__global__ void router_topk_kernel(const float* __restrict__ logits, int n_experts, int k,
                                   bool normalize, int* __restrict__ ids,
                                   float* __restrict__ weights) {
  extern __shared__ float probs[];
  auto* taken = reinterpret_cast<unsigned char*>(probs + n_experts);
  const float* l = logits + size_t(blockIdx.x) * n_experts;
  const int lane = threadIdx.x;
  warp_softmax(l, n_experts, lane, probs, taken);
  int* out_ids = ids + size_t(blockIdx.x) * k;
  float* out_w = weights + size_t(blockIdx.x) * k;
  float wsum = 0;
  for (int j = 0; j < k; ++j) {
    float bp;
    const int best = warp_pick_best(probs, taken, nullptr, 1, n_experts, lane, &bp);
    if (lane == 0) {
      out_ids[j] = best;
      out_w[j] = bp;
      taken[best] = 1;
    }
    wsum += bp;
    __syncwarp();
  }
  if (normalize && lane == 0)
    for (int j = 0; j < k; ++j) out_w[j] /= wsum;
}

}  // namespace

void router_topk_cuda(const float* logits, int n_tokens, int n_experts, int k, bool normalize,
                      int* ids, float* weights, cudaStream_t s) {
  MOE_ASSERT(logits && ids && weights && n_tokens > 0 && k > 0 && k <= n_experts &&
                 n_experts <= kMaxExperts,
             "router_topk_cuda: bad arguments");
  const size_t shared = size_t(n_experts) * (sizeof(float) + 1);
  router_topk_kernel<<<n_tokens, kThreads, shared, s>>>(logits, n_experts, k, normalize, ids,
                                                        weights);
  MOE_CUDA_CHECK_LAUNCH("router_topk_kernel");
}

void router_topk(const float* logits, int n_tokens, int n_experts, int k, bool normalize,
                 int* ids, float* weights, Stream s) {
  if (n_tokens <= 0 || n_experts <= 0 || n_experts > kMaxExperts || k <= 0 || k > n_experts)
    throw Error("gpu::router_topk: bad shape n_tokens=" + std::to_string(n_tokens) +
                " n_experts=" + std::to_string(n_experts) + " (max " + std::to_string(kMaxExperts) +
                ") k=" + std::to_string(k));
  if (!logits || !ids || !weights) throw Error("gpu::router_topk: null device pointer");
  router_topk_cuda(logits, n_tokens, n_experts, k, normalize, ids, weights, s);
}

}  // namespace moestream::gpu
