// Qwen3's per-head QK-norm and RoPE of a chunk's q and k heads in one launch (issue 19: the
// decode step's four launches of rms_norm and rope_neox become one). The same arithmetic as
// rms_norm_kernel (a thread's square, block_sum) then rope_neox_kernel on the normed head.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kMaxHeadDim = 1024;  // one thread per dim of a head

// Block b: token b / (n_q + n_k), head b % (n_q + n_k) (q heads first, then k heads); thread i
// owns dim i. The normed head goes through shared memory, then thread i < half rotates the pair
// (i, i + half).
__global__ void qk_norm_rope_kernel(const float* __restrict__ q_in, const float* __restrict__ k_in,
                                    const float* __restrict__ q_w, const float* __restrict__ k_w,
                                    int n_q, int n_k, int head_dim, float eps,
                                    const float* __restrict__ cos, const float* __restrict__ sin,
                                    float* __restrict__ q_out, float* __restrict__ k_out) {
  __shared__ float normed[kMaxHeadDim];
  const int heads = n_q + n_k;
  const int t = blockIdx.x / heads, hh = blockIdx.x % heads;
  const bool is_q = hh < n_q;
  const size_t row = is_q ? size_t(t) * n_q + hh : size_t(t) * n_k + (hh - n_q);
  const float* x = (is_q ? q_in : k_in) + row * head_dim;
  const float* w = is_q ? q_w : k_w;
  float* out = (is_q ? q_out : k_out) + row * head_dim;
  const int i = threadIdx.x;
  const float v = i < head_dim ? x[i] : 0.f;
  const float ss = block_sum(v * v);
  const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
  if (i < head_dim) normed[i] = v * inv * w[i];
  __syncthreads();
  const int half = head_dim / 2;
  if (i < half) {
    const float c = cos[size_t(t) * half + i], sn = sin[size_t(t) * half + i];
    const float a = normed[i], b = normed[i + half];
    out[i] = a * c - b * sn;
    out[i + half] = b * c + a * sn;
  }
}

}  // namespace

void qk_norm_rope(const float* q_in, const float* k_in, const float* q_norm, const float* k_norm,
                  int n_tokens, int n_q_heads, int n_k_heads, int head_dim, float eps,
                  const float* cos, const float* sin, float* q_out, float* k_out, Stream s) {
  if (n_tokens <= 0 || n_q_heads <= 0 || n_k_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
      head_dim > kMaxHeadDim || !(eps >= 0))
    throw Error("gpu::qk_norm_rope: bad shape n_tokens=" + std::to_string(n_tokens) +
                " heads=" + std::to_string(n_q_heads) + "/" + std::to_string(n_k_heads) +
                " head_dim=" + std::to_string(head_dim) + " (even, <= " +
                std::to_string(kMaxHeadDim) + ")");
  if (!q_in || !k_in || !q_norm || !k_norm || !cos || !sin || !q_out || !k_out)
    throw Error("gpu::qk_norm_rope: null device pointer");
  const long long blocks = (long long)n_tokens * (n_q_heads + n_k_heads);
  if (blocks >= (1ll << 31)) throw Error("gpu::qk_norm_rope: too many heads for one launch");
  const int threads = (head_dim + 31) / 32 * 32;
  qk_norm_rope_kernel<<<unsigned(blocks), threads, 0, s>>>(q_in, k_in, q_norm, k_norm, n_q_heads,
                                                         n_k_heads, head_dim, eps, cos, sin, q_out,
                                                         k_out);
  MOE_CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

}  // namespace moestream::gpu
