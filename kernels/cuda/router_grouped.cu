// The grouped sigmoid router of GLM-4.5 and DeepSeek-V3 on the GPU, one warp per token. The
// reference is runtime/model/routing.cpp route_sigmoid_grouped: scores = sigmoid(logits); choice
// = score + correction bias (selection only); a group's score is the sum of its two best choice
// values; the topk_group best groups are kept; the k best choice values among their experts are
// selected (ties: lower group, then lower id); weights = the chosen unbiased scores, divided by
// their sum (+1e-20) when normalising, times the routed scaling factor. Every step runs in the
// reference's order, so only expf against std::exp (a few ulp) can differ.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/router_select.cuh"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 32;
constexpr int kMaxExperts = 4096;  // choice [E] floats + taken [E] bytes + groups in shared memory
constexpr int kMaxGroups = 64;

__device__ __forceinline__ float sigmoid_ref(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void router_grouped_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                      int n_experts, int k, int n_group, int topk_group,
                                      bool normalize, float scaling, int* __restrict__ ids,
                                      float* __restrict__ weights) {
  extern __shared__ float choice[];
  auto* taken = reinterpret_cast<unsigned char*>(choice + n_experts);
  __shared__ float gscore[kMaxGroups];
  __shared__ unsigned char kept[kMaxGroups];
  const float* l = logits + size_t(blockIdx.x) * n_experts;
  const int lane = threadIdx.x, per = n_experts / n_group;
  for (int e = lane; e < n_experts; e += 32) {
    choice[e] = sigmoid_ref(l[e]) + (bias != nullptr ? bias[e] : 0.0f);
    taken[e] = 0;
  }
  __syncwarp();
  // Each lane scores its groups (the two best values, in expert order, as the reference).
  for (int g = lane; g < n_group; g += 32) {
    float a = -INFINITY, b = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      const float c = choice[e];
      if (c > a) {
        b = a;
        a = c;
      } else if (c > b) {
        b = c;
      }
    }
    gscore[g] = a + b;
  }
  __syncwarp();
  keep_top_groups(gscore, kept, n_group, topk_group, lane);
  int* out_ids = ids + size_t(blockIdx.x) * k;
  float* out_w = weights + size_t(blockIdx.x) * k;
  for (int j = 0; j < k; ++j) {
    float bc;
    const int best = warp_pick_best(choice, taken, kept, per, n_experts, lane, &bc);
    if (lane == 0) {
      out_ids[j] = best;
      taken[best] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += out_w[j] = sigmoid_ref(l[out_ids[j]]);
    const float denom = normalize ? sum + 1e-20f : 1.0f;
    for (int j = 0; j < k; ++j) out_w[j] = out_w[j] / denom * scaling;
  }
}

}  // namespace

void router_grouped(const float* logits, const float* bias, int n_tokens, int n_experts, int k,
                    int n_group, int topk_group, bool normalize, float scaling, int* ids,
                    float* weights, Stream s) {
  const bool groups_ok = n_group > 0 && n_group <= kMaxGroups && n_experts % n_group == 0 &&
                         n_experts / n_group >= 2 && topk_group > 0 && topk_group <= n_group &&
                         k <= topk_group * (n_experts / n_group);
  if (n_tokens <= 0 || n_experts <= 0 || n_experts > kMaxExperts || k <= 0 || !groups_ok)
    throw Error("gpu::router_grouped: bad shape n_tokens=" + std::to_string(n_tokens) +
                " n_experts=" + std::to_string(n_experts) + " (max " + std::to_string(kMaxExperts) +
                ") k=" + std::to_string(k) + " n_group=" + std::to_string(n_group) +
                " topk_group=" + std::to_string(topk_group));
  if (!logits || !ids || !weights) throw Error("gpu::router_grouped: null device pointer");
  const size_t shared = size_t(n_experts) * (sizeof(float) + 1);
  router_grouped_kernel<<<n_tokens, kThreads, shared, s>>>(logits, bias, n_experts, k, n_group,
                                                           topk_group, normalize, scaling, ids, weights);
  MOE_CUDA_CHECK_LAUNCH("router_grouped_kernel");
}

}  // namespace moestream::gpu
