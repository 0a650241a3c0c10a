// Internal to kernels/: the grouped expert GEMM's tile loop, shared by the q8/q4/bf16 files, each
// of which supplies a codec that dequantises a lane's slice of a weight row in registers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {

constexpr int kGemmWarps = 4;  // warps per block

// Arguments of one launch (w and row_start are device arrays).
struct GemmArgs {
  const uint8_t* const* w;
  size_t matrix_offset;
  const int* row_start;
  int rows, cols;
  const float* x;
  float* y;
};

// Weight loads go through the read-only path (__ldg): payloads never change during a kernel.
__device__ __forceinline__ float load_half(const uint8_t* p) {  // p 2-byte aligned
  const __half_raw hr{__ldg(reinterpret_cast<const unsigned short*>(p))};
  return __half2float(__half(hr));
}

// 4 bytes at a 2-byte aligned address (4-byte aligned when `aligned4`), little-endian.
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p, bool aligned4) {
  if (aligned4) return __ldg(reinterpret_cast<const unsigned int*>(p));
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return uint32_t(__ldg(h)) | (uint32_t(__ldg(h + 1)) << 16);
}

// Block (row tile, group g): each warp owns RW weight rows; for each tile of MT of the group's
// token rows it walks the columns once, every lane dequantising Codec::kElems weights per row
// and step and multiplying them into MT accumulators per row, so each weight load serves MT
// tokens. Token tiles after the first re-read the block's rows from L1/L2, not HBM.
// Codec: kElems; Codec(const uint8_t* matrix, int cols); steps(); load_w(row, step, lane, w[]);
// load_x(const float* xrow, step, lane, x[]) (zeros where the lane's slice is past the row).
template <class Codec, int MT, int RW>
__global__ void __launch_bounds__(kGemmWarps * 32) expert_gemm_kernel(GemmArgs a) {
  constexpr int E = Codec::kElems;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = blockIdx.y;
  const int row_base = (blockIdx.x * kGemmWarps + warp) * RW;
  if (row_base >= a.rows) return;
  const int t_begin = a.row_start[g], t_end = a.row_start[g + 1];
  if (t_begin >= t_end) return;  // an expert no token chose
  const Codec codec(a.w[g] + a.matrix_offset, a.cols);
  const int n_steps = codec.steps();
  int row[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) row[rr] = min(row_base + rr, a.rows - 1);  // clamp, not stored

  for (int t0 = t_begin; t0 < t_end; t0 += MT) {
    const float* xt[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) xt[t] = a.x + size_t(min(t0 + t, t_end - 1)) * a.cols;
    float acc[RW][MT];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
#pragma unroll
      for (int t = 0; t < MT; ++t) acc[rr][t] = 0.f;

    // Decode (MT 1) has few registers per step: unroll deep so many loads are in flight.
    constexpr int kUnroll = MT == 1 ? 8 : 2;
#pragma unroll kUnroll
    for (int st = 0; st < n_steps; ++st) {
      float wv[RW][E];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) codec.load_w(row[rr], st, lane, wv[rr]);
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        float xv[E];
        codec.load_x(xt[t], st, lane, xv);
#pragma unroll
        for (int rr = 0; rr < RW; ++rr)
#pragma unroll
          for (int e = 0; e < E; ++e) acc[rr][t] += wv[rr][e] * xv[e];
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const float v = warp_sum(acc[rr][t]);
        if (lane == 0 && row_base + rr < a.rows && t0 + t < t_end)
          a.y[size_t(t0 + t) * a.rows + row_base + rr] = v;
      }
  }
}

// Launch with the token tile chosen from the largest group: 1 for decode (groups of one row),
// up to 8 for prefill. Rows per warp: 2 at MT 1 (more blocks for a single-row decode), else 4.
template <class Codec>
void launch_expert_gemm(const GemmArgs& a, int n_groups, int max_rows_per_group, const char* name,
                        cudaStream_t s) {
  const auto launch = [&](auto mt, auto rw) {
    constexpr int MT = decltype(mt)::value, RW = decltype(rw)::value;
    const int rows_per_block = kGemmWarps * RW;
    const dim3 grid(unsigned((a.rows + rows_per_block - 1) / rows_per_block), unsigned(n_groups));
    expert_gemm_kernel<Codec, MT, RW><<<grid, kGemmWarps * 32, 0, s>>>(a);
  };
  if (max_rows_per_group <= 1)
    launch(std::integral_constant<int, 1>{}, std::integral_constant<int, 2>{});
  else if (max_rows_per_group <= 2)
    launch(std::integral_constant<int, 2>{}, std::integral_constant<int, 4>{});
  else if (max_rows_per_group <= 4)
    launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 4>{});
  else
    launch(std::integral_constant<int, 8>{}, std::integral_constant<int, 4>{});
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) throw_cuda(e, name, __FILE__, __LINE__);
}

// Launchers (preconditions asserted; the op wrapper in expert_gemm.cu checks shapes).
void expert_gemm_q8_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s);
void expert_gemm_q4_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s);
void expert_gemm_bf16_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s);

}  // namespace moestream::gpu
