// DeepSeek-V2's group-limited greedy router on the GPU (issue 20), one warp per token. Reference:
// runtime/model/routing.cpp route_softmax_grouped: probs = softmax over all experts; a group's
// score is its best probability; the topk_group best groups are kept (ties: lower group); the k
// best probabilities among their experts are selected (ties: lower id); weights = those
// probabilities, normalised when asked, times the routed scaling factor. The softmax sums in warp
// order (a few ulp from the CPU's sequential sum); every selection step is the reference's.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/router_select.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 32;
constexpr int kMaxExperts = 4096;  // probs [E] floats + taken [E] bytes in shared memory
constexpr int kMaxGroups = 64;

__global__ void router_grouped_softmax_kernel(const float* __restrict__ logits, int n_experts, int k,
                                              int n_group, int topk_group, bool normalize, float scaling,
                                              int* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float probs[];
  auto* taken = reinterpret_cast<unsigned char*>(probs + n_experts);
  __shared__ float gscore[kMaxGroups];
  __shared__ unsigned char kept[kMaxGroups];
  const float* l = logits + size_t(blockIdx.x) * n_experts;
  const int lane = threadIdx.x, per = n_experts / n_group;
  warp_softmax(l, n_experts, lane, probs, taken);
  for (int g = lane; g < n_group; g += 32) {
    float best = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) best = fmaxf(best, probs[e]);
    gscore[g] = best;
  }
  __syncwarp();
  keep_top_groups(gscore, kept, n_group, topk_group, lane);
  int* out_ids = ids + size_t(blockIdx.x) * k;
  float* out_w = weights + size_t(blockIdx.x) * k;
  for (int j = 0; j < k; ++j) {
    float bp;
    const int best = warp_pick_best(probs, taken, kept, per, n_experts, lane, &bp);
    if (lane == 0) {
      out_ids[j] = best;
      out_w[j] = bp;
      taken[best] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {  // in the reference's order: normalise, then scale
    if (normalize) {
      float s = 0;
      for (int j = 0; j < k; ++j) s += out_w[j];
      for (int j = 0; j < k; ++j) out_w[j] /= s;
    }
    for (int j = 0; j < k; ++j) out_w[j] *= scaling;
  }
}

}  // namespace

void router_grouped_softmax(const float* logits, int n_tokens, int n_experts, int k, int n_group,
                            int topk_group, bool normalize, float scaling, int* ids, float* weights, Stream s) {
  const bool groups_ok = n_group > 0 && n_group <= kMaxGroups && n_experts % n_group == 0 && topk_group > 0 &&
                         topk_group <= n_group && (long long)topk_group * (n_experts / n_group) >= k;
  if (n_tokens <= 0 || n_experts <= 0 || n_experts > kMaxExperts || k <= 0 || !groups_ok)
    throw Error("gpu::router_grouped_softmax: bad shape n_tokens=" + std::to_string(n_tokens) +
                " n_experts=" + std::to_string(n_experts) + " (max " + std::to_string(kMaxExperts) +
                ") k=" + std::to_string(k) + " n_group=" + std::to_string(n_group) + " (max " +
                std::to_string(kMaxGroups) + ") topk_group=" + std::to_string(topk_group));
  if (!logits || !ids || !weights) throw Error("gpu::router_grouped_softmax: null device pointer");
  const size_t shared = size_t(n_experts) * (sizeof(float) + 1);
  router_grouped_softmax_kernel<<<n_tokens, kThreads, shared, s>>>(logits, n_experts, k, n_group, topk_group,
                                                                   normalize, scaling, ids, weights);
  MOE_CUDA_CHECK_LAUNCH("router_grouped_softmax_kernel");
}

}  // namespace moestream::gpu
