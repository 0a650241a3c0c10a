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

// One block. Thread 0 sorts the k ids (insertion sort: k <= 64) and writes the plan; every
// thread copies a share of x into x_snap. A duplicate id, an id outside the table or an expert
// the table lacks sets *miss (the host then redoes the layer through the synced path); the
// pointer of such a group is `fallback`, so the kernels that follow read valid memory.
__global__ void moe_plan_decode_kernel(const int* __restrict__ ids, int k,
                                       const uint8_t* const* __restrict__ table, int n_experts,
                                       const uint8_t* fallback, int* __restrict__ gather_idx,
                                       int* __restrict__ pair_row, int* __restrict__ row_start,
                                       const uint8_t** __restrict__ ptrs, int* __restrict__ miss,
                                       const float* __restrict__ x, float* __restrict__ x_snap,
                                       int dim) {
  for (int d = threadIdx.x; d < dim; d += blockDim.x) x_snap[d] = x[d];
  if (threadIdx.x != 0) return;
  int order[kMaxK];
  for (int j = 0; j < k; ++j) {
    int i = j;
    while (i > 0 && ids[order[i - 1]] > ids[j]) {
      order[i] = order[i - 1];
      --i;
    }
    order[i] = j;
  }
  int missing = 0;
  for (int g = 0; g < k; ++g) {
    const int j = order[g];
    const int e = ids[j];
    const bool in_range = e >= 0 && e < n_experts;
    const uint8_t* p = in_range ? table[e] : nullptr;
    if (p == nullptr || (g > 0 && ids[order[g - 1]] == e)) {
      missing = 1;
      p = fallback;
    }
    gather_idx[g] = 0;  // every row is the token's one row
    pair_row[j] = g;
    row_start[g] = g;
    ptrs[g] = p;
  }
  row_start[k] = k;
  *miss = missing;
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
