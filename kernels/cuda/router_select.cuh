// Internal to kernels/: the selection steps the one-warp-per-token routers share (router_topk.cu,
// router_grouped.cu, router_grouped_softmax.cu, gpt_oss.cu): the one top-k of the GPU, in its CPU
// reference's order (runtime/model/routing.cpp select_top_k), so the choices match it exactly.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {

// probs[e] = softmax(logits)[e] over n_experts (max subtracted first, as the CPU's softmax), and
// taken[e] = 0, by one warp; ends with the warp in sync.
__device__ __forceinline__ void warp_softmax(const float* logits, int n_experts, int lane, float* probs,
                                             unsigned char* taken) {
  float m = -INFINITY;
  for (int e = lane; e < n_experts; e += 32) m = fmaxf(m, logits[e]);
  m = warp_max(m);
  float sum = 0;
  for (int e = lane; e < n_experts; e += 32) {
    const float p = expf(logits[e] - m);
    probs[e] = p;
    taken[e] = 0;
    sum += p;
  }
  sum = warp_sum(sum);
  for (int e = lane; e < n_experts; e += 32) probs[e] /= sum;
  __syncwarp();
}

// kept[g] = 1 for the topk_group groups of highest gscore (repeated argmax: ties to the lower
// group); every group is kept when n_group is 1. Lane 0 decides; the warp syncs after.
__device__ __forceinline__ void keep_top_groups(const float* gscore, unsigned char* kept, int n_group,
                                                int topk_group, int lane) {
  for (int g = lane; g < n_group; g += 32) kept[g] = n_group == 1;
  __syncwarp();
  if (lane == 0 && n_group > 1)
    for (int j = 0; j < topk_group; ++j) {
      int best = -1;
      for (int g = 0; g < n_group; ++g)
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      kept[best] = 1;
    }
  __syncwarp();
}

// The expert of largest value among kept groups (groups of `per` consecutive ids; kept null:
// every expert competes) not yet taken; equal values go to the lower id. Every lane returns it (with its value in *v); the caller marks
// it taken. Ends with the warp in sync.
__device__ __forceinline__ int warp_pick_best(const float* value, const unsigned char* taken,
                                              const unsigned char* kept, int per, int n_experts, int lane,
                                              float* v) {
  int best = -1;
  float bv = 0;
  for (int e = lane; e < n_experts; e += 32)
    if ((kept == nullptr || kept[e / per]) && !taken[e] && (best < 0 || value[e] > bv)) best = e, bv = value[e];
  for (int o = 16; o > 0; o >>= 1) {
    const int ob = __shfl_xor_sync(0xffffffffu, best, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
  }
  *v = bv;
  return best;
}

}  // namespace moestream::gpu
