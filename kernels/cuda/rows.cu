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

// One block over the row: each thread keeps the first of its largest values (its indices rise),
// then the block keeps the lowest index among equal maxima: Sampler::argmax's rule. A value
// counts only when above the kept one, or equal to it with none kept yet (so -inf can win, NaN
// never does); no value kept anywhere (all NaN) gives 0.
constexpr int kArgmaxThreads = 1024;
constexpr int kNone = 0x7fffffff;

__device__ __forceinline__ void argmax_merge(float& v, int& i, float ov, int oi) {
  if (oi != kNone && (i == kNone || ov > v || (ov == v && oi < i))) v = ov, i = oi;
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    argmax_merge(v, i, ov, oi);
  }
}

__global__ void argmax_kernel(const float* __restrict__ x, int n, int* __restrict__ out) {
  __shared__ float vs[32];
  __shared__ int is[32];
  float v = -INFINITY;
  int i = kNone;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float xj = x[j];
    if (xj > v || (xj == v && i == kNone)) v = xj, i = j;
  }
  warp_argmax(v, i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) vs[warp] = v, is[warp] = i;
  __syncthreads();
  if (warp != 0) return;
  const int n_warps = blockDim.x >> 5;
  v = lane < n_warps ? vs[lane] : -INFINITY;
  i = lane < n_warps ? is[lane] : kNone;
  warp_argmax(v, i);
  if (lane == 0) *out = i == kNone ? 0 : i;
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

void argmax(const float* x, int n, int* out, Stream s) {
  if (n <= 0) throw Error("gpu::argmax: empty row (n=" + std::to_string(n) + ")");
  if (!x || !out) throw Error("gpu::argmax: null device pointer");
  argmax_kernel<<<1, kArgmaxThreads, 0, s>>>(x, n, out);
  MOE_CUDA_CHECK_LAUNCH("argmax_kernel");
}

void embed_rows(const float* table, const int* ids, int n, int dim, float* out, Stream s) {
  if (n <= 0 || dim <= 0) throw Error("gpu::embed_rows: bad shape " + rows_shape(n, dim));
  if (!table || !ids || !out) throw Error("gpu::embed_rows: null device pointer");
  gather_rows_cuda(table, ids, n, dim, out, s);  // the same row copy, ids checked by the caller
}

}  // namespace moestream::gpu
