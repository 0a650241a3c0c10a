// The MoE plan of one decode token built on the device (issue 19): the router's top-k ids are
// turned into the grouped-GEMM plan and the experts' payload pointers without a trip to the host,
// reading a device-resident expert-to-slot table. The layout is the one CudaForward::moe writes
// on the host for an all-hit token, so the expert kernels and the combine cannot tell the two apart.
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxK = 64;

// One block. Thread 0 loads the k ids at once and sorts them (insertion sort in registers: k <=
// 64); then thread g writes group g, its table lookup in parallel with the others' (a serial
// chain of dependent global loads was most of this kernel's time). Every thread copies a share of
// x into x_snap. A duplicate id, an id outside the table or an expert the table lacks sets *miss
// (the host then redoes the layer through the synced path); the pointer of such a group is
// `fallback`, so the kernels that follow read valid memory.
__global__ void moe_plan_decode_kernel(const int* __restrict__ ids, int k,
                                       const uint8_t* const* __restrict__ table, int n_experts,
                                       const uint8_t* fallback, int* __restrict__ gather_idx,
                                       int* __restrict__ pair_row, int* __restrict__ row_start,
                                       const uint8_t** __restrict__ ptrs, int* __restrict__ miss,
                                       const float* __restrict__ x, float* __restrict__ x_snap,
                                       int dim) {
  __shared__ int order_s[kMaxK], sorted_s[kMaxK];
  for (int d = threadIdx.x; d < dim; d += blockDim.x) x_snap[d] = x[d];
  if (threadIdx.x == 0) {
    int id[kMaxK], order[kMaxK];
    for (int j = 0; j < k; ++j) id[j] = ids[j];
    for (int j = 0; j < k; ++j) {
      int i = j;
      while (i > 0 && id[order[i - 1]] > id[j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
    for (int g = 0; g < k; ++g) {
      order_s[g] = order[g];
      sorted_s[g] = id[order[g]];
    }
    row_start[k] = k;
  }
  __syncthreads();
  int missing = 0;
  const int g = threadIdx.x;
  if (g < k) {
    const int j = order_s[g], e = sorted_s[g];
    const bool in_range = e >= 0 && e < n_experts;
    const uint8_t* p = in_range ? table[e] : nullptr;
    if (p == nullptr || (g > 0 && sorted_s[g - 1] == e)) {
      missing = 1;
      p = fallback;
    }
    gather_idx[g] = 0;  // every row is the token's one row
    pair_row[j] = g;
    row_start[g] = g;
    ptrs[g] = p;
  }
  missing = __syncthreads_or(missing);
  if (threadIdx.x == 0) *miss = missing;
}

}  // namespace

void moe_plan_decode(const int* ids, int k, const uint8_t* const* table, int n_experts,
                     const uint8_t* fallback, int* gather_idx, int* pair_row, int* row_start,
                     const uint8_t** ptrs, int* miss, const float* x, float* x_snap, int dim,
                     Stream s) {
  if (k <= 0 || k > kMaxK || n_experts <= 0 || dim <= 0)
    throw Error("gpu::moe_plan_decode: bad shape k=" + std::to_string(k) + " n_experts=" +
                std::to_string(n_experts) + " dim=" + std::to_string(dim) + " (k at most " +
                std::to_string(kMaxK) + ")");
  if (!ids || !table || !fallback || !gather_idx || !pair_row || !row_start || !ptrs || !miss || !x ||
      !x_snap)
    throw Error("gpu::moe_plan_decode: null device pointer");
  moe_plan_decode_kernel<<<1, kThreads, 0, s>>>(ids, k, table, n_experts, fallback, gather_idx,
                                                pair_row, row_start, ptrs, miss, x, x_snap, dim);
  MOE_CUDA_CHECK_LAUNCH("moe_plan_decode_kernel");
}

}  // namespace moestream::gpu
