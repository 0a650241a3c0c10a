// Row glue of the GPU forward pass: gather (token rows -> grouped expert rows, embedding lookup),
// the MoE combine in the CPU's fixed top-k order, the residual add and the gated shared-expert add,
// and greedy decoding's argmax of a logits row.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 65535;  // grid-stride loops past this

// One block (grid-stride) per output row; threads stride the row.
__global__ void gather_rows_kernel(const float* __restrict__ src, const int* __restrict__ idx,
                                   int n, int dim, float* __restrict__ out) {
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const float* s = src + size_t(idx[i]) * dim;
    float* o = out + size_t(i) * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) o[d] = s[d];
  }
}

// out[t] = sum_{j<k} weights[t*k+j] * y[pair_row[t*k+j]], summed from zero in j order as
// runtime/model/moe_layer.cpp does, so the result does not depend on the grouping of y. Grid x
// strides tokens, grid y splits a row (a decode token's one row would leave one block
// latency-bound). kAdd: out[t] += the sum (the residual add, the same float as add_inplace of it).
template <bool kAdd>
__global__ void moe_combine_kernel(const float* __restrict__ y, const int* __restrict__ pair_row,
                                   const float* __restrict__ weights, int n_tokens, int k, int dim,
                                   float* __restrict__ out) {
  for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    const int* pr = pair_row + size_t(t) * k;
    const float* wt = weights + size_t(t) * k;
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < dim; d += gridDim.y * blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < k; ++j) acc += wt[j] * y[size_t(pr[j]) * dim + d];
      if constexpr (kAdd) out[size_t(t) * dim + d] += acc;
      else out[size_t(t) * dim + d] = acc;
    }
  }
}

__global__ void add_inplace_kernel(float* __restrict__ y, const float* __restrict__ x, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// One block (grid-stride) per token row; the row's gate is read once per thread.
__global__ void gated_add_kernel(float* __restrict__ y, const float* __restrict__ x,
                                 const float* __restrict__ gate, int n_tokens, int dim) {
  for (int t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    const float g = 1.0f / (1.0f + expf(-gate[t]));
    for (int d = threadIdx.x; d < dim; d += blockDim.x) y[size_t(t) * dim + d] += g * x[size_t(t) * dim + d];
  }
}

// Greedy decoding's pick, Sampler::argmax's rule: the largest value, the lowest index among
// equal ones, NaN never (all NaN: 0). Each value becomes one 64-bit key whose order is that rule:
// the float's bits made monotone (-0 taken as +0) above the complement of its index. The blocks
// grid-stride the row and atomicMax their best key into the state; the block that finishes last
// writes the id and zeroes the state for the next launch (one launch, no second pass).
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerThread = 4;  // values a thread loads before it compares any
constexpr unsigned kArgmaxMaxBlocks = 1024;

__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  if (v != v) return 0;  // NaN: below every value
  const unsigned u = __float_as_uint(v + 0.0f);  // -0 -> +0: equal values, equal keys
  const unsigned ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007fffff > 0
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - unsigned(i));
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ x, int n,
                                                               ArgmaxState* st) {
  __shared__ unsigned long long warp_best[kArgmaxThreads / 32];
  unsigned long long best = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += stride * kArgmaxPerThread) {
    float v[kArgmaxPerThread];
#pragma unroll
    for (int k = 0; k < kArgmaxPerThread; ++k) v[k] = i0 + k * stride < n ? x[i0 + k * stride] : NAN;
#pragma unroll
    for (int k = 0; k < kArgmaxPerThread; ++k) best = max(best, argmax_key(v[k], int(i0 + k * stride)));
  }
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) best = max(best, warp_best[w]);
    if (best != 0) atomicMax(&st->best, best);
    __threadfence();  // this block's maximum is seen before its count
    if (atomicAdd(&st->done, 1u) == gridDim.x - 1) {
      const unsigned long long all = atomicExch(&st->best, 0ull);
      st->id = all == 0 ? 0 : int(0xffffffffu - unsigned(all & 0xffffffffu));
      st->done = 0;
    }
  }
}

std::string rows_shape(int n, int dim) {
  return "n=" + std::to_string(n) + " dim=" + std::to_string(dim);
}

}  // namespace

void gather_rows_cuda(const float* src, const int* idx, int n, int dim, float* out,
                      cudaStream_t s) {
  MOE_ASSERT(src && idx && out && n > 0 && dim > 0, "gather_rows_cuda: bad arguments");
  gather_rows_kernel<<<std::min(unsigned(n), kMaxBlocks), kThreads, 0, s>>>(src, idx, n, dim, out);
  MOE_CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

void moe_combine_cuda(const float* y, const int* pair_row, const float* weights, int n_tokens,
                      int k, int dim, float* out, bool add, cudaStream_t s) {
  MOE_ASSERT(y && pair_row && weights && out && n_tokens > 0 && k > 0 && dim > 0,
             "moe_combine_cuda: bad arguments");
  // Row splits only while the grid is small: a prefill chunk has blocks enough.
  const unsigned splits = n_tokens >= 32 ? 1u : unsigned((dim + kThreads - 1) / kThreads);
  const dim3 grid(std::min(unsigned(n_tokens), kMaxBlocks), std::min(splits, 64u));
  if (add)
    moe_combine_kernel<true><<<grid, kThreads, 0, s>>>(y, pair_row, weights, n_tokens, k, dim, out);
  else
    moe_combine_kernel<false><<<grid, kThreads, 0, s>>>(y, pair_row, weights, n_tokens, k, dim, out);
  MOE_CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

void add_inplace_cuda(float* y, const float* x, size_t n, cudaStream_t s) {
  MOE_ASSERT(y && x && n > 0, "add_inplace_cuda: bad arguments");
  const unsigned blocks = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  add_inplace_kernel<<<blocks, kThreads, 0, s>>>(y, x, n);
  MOE_CUDA_CHECK_LAUNCH("add_inplace_kernel");
}

// The launcher (used only here, so declared here rather than in cuda_check.cuh).
void gated_add_cuda(float* y, const float* x, const float* gate, int n_tokens, int dim, cudaStream_t s) {
  MOE_ASSERT(y && x && gate && n_tokens > 0 && dim > 0, "gated_add_cuda: bad arguments");
  gated_add_kernel<<<std::min(unsigned(n_tokens), kMaxBlocks), kThreads, 0, s>>>(y, x, gate, n_tokens, dim);
  MOE_CUDA_CHECK_LAUNCH("gated_add_kernel");
}

void gather_rows(const float* src, const int* idx, int n, int dim, float* out, Stream s) {
  if (n <= 0 || dim <= 0) throw Error("gpu::gather_rows: bad shape " + rows_shape(n, dim));
  if (!src || !idx || !out) throw Error("gpu::gather_rows: null device pointer");
  gather_rows_cuda(src, idx, n, dim, out, s);
}

void moe_combine(const float* y, const int* pair_row, const float* weights, int n_tokens, int k,
                 int dim, float* out, Stream s) {
  if (n_tokens <= 0 || k <= 0 || dim <= 0)
    throw Error("gpu::moe_combine: bad shape n_tokens=" + std::to_string(n_tokens) +
                " k=" + std::to_string(k) + " dim=" + std::to_string(dim));
  if (!y || !pair_row || !weights || !out) throw Error("gpu::moe_combine: null device pointer");
  moe_combine_cuda(y, pair_row, weights, n_tokens, k, dim, out, false, s);
}

void moe_combine_add(const float* y, const int* pair_row, const float* weights, int n_tokens,
                     int k, int dim, float* x, Stream s) {
  if (n_tokens <= 0 || k <= 0 || dim <= 0)
    throw Error("gpu::moe_combine_add: bad shape n_tokens=" + std::to_string(n_tokens) +
                " k=" + std::to_string(k) + " dim=" + std::to_string(dim));
  if (!y || !pair_row || !weights || !x) throw Error("gpu::moe_combine_add: null device pointer");
  moe_combine_cuda(y, pair_row, weights, n_tokens, k, dim, x, true, s);
}

void add_inplace(float* y, const float* x, size_t n, Stream s) {
  if (n == 0) throw Error("gpu::add_inplace: empty input (n=0)");
  if (!y || !x) throw Error("gpu::add_inplace: null device pointer");
  add_inplace_cuda(y, x, n, s);
}

void gated_add(float* y, const float* x, const float* gate, int n_tokens, int dim, Stream s) {
  if (n_tokens <= 0 || dim <= 0) throw Error("gpu::gated_add: bad shape " + rows_shape(n_tokens, dim));
  if (!y || !x || !gate) throw Error("gpu::gated_add: null device pointer");
  gated_add_cuda(y, x, gate, n_tokens, dim, s);
}

void argmax(const float* x, int n, ArgmaxState* state, Stream s) {
  if (n <= 0) throw Error("gpu::argmax: empty row (n=" + std::to_string(n) + ")");
  if (!x || !state) throw Error("gpu::argmax: null device pointer");
  const long long per_block = (long long)kArgmaxThreads * kArgmaxPerThread;
  const unsigned blocks = unsigned(std::min<long long>((n + per_block - 1) / per_block, kArgmaxMaxBlocks));
  argmax_kernel<<<blocks, kArgmaxThreads, 0, s>>>(x, n, state);
  MOE_CUDA_CHECK_LAUNCH("argmax_kernel");
}

void embed_rows(const float* table, const int* ids, int n, int dim, float* out, Stream s) {
  if (n <= 0 || dim <= 0) throw Error("gpu::embed_rows: bad shape " + rows_shape(n, dim));
  if (!table || !ids || !out) throw Error("gpu::embed_rows: null device pointer");
  gather_rows_cuda(table, ids, n, dim, out, s);  // the same row copy, ids checked by the caller
}

}  // namespace moestream::gpu
