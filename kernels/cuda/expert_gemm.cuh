// Internal to kernels/: the grouped expert GEMM's tile loop, shared by the q8/q4/bf16 files and
// the ggml block types' files, each of which supplies a codec that dequantises a lane's slice of a
// weight row in registers. The same loop is the dense GEMM (one matrix, token chunks as groups)
// and the codecs' store() gives dequantize_rows.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/warp_reduce.cuh"
#include "loader/format/expert_file.h"
#include "loader/format/ggml_types.h"

namespace moestream::gpu {

constexpr int kGemmWarps = 4;  // warps per block

// Arguments of one launch. Grouped (expert_gemm): w and row_start are device arrays, group g's
// matrix is w[g] + matrix_offset. Dense (dense_gemm): w and row_start are nullptr, the one matrix
// is `matrix` and group g is the token chunk [g * dense_chunk, min(n_tokens, (g+1) * dense_chunk)):
// no device array to fill, and a long prompt still spreads over the grid.
struct GemmArgs {
  const uint8_t* const* w;
  size_t matrix_offset;
  const int* row_start;
  int rows, cols;
  const float* x;
  float* y;
  const uint8_t* matrix = nullptr;
  int n_tokens = 0;
  int dense_chunk = 0;
};

// The launchers' common precondition: a matrix (or payload array and row starts) and a shape.
inline bool gemm_args_ok(const GemmArgs& a) {
  return (a.w ? a.row_start != nullptr : a.matrix != nullptr && a.dense_chunk > 0) && a.x &&
         a.y && a.rows > 0 && a.cols > 0;
}

// Token rows of a dense GEMM per grid row (see GemmArgs).
constexpr int kDenseTokenChunk = 64;

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

// Byte k of v minus `bias`, as a float, exactly, without the int-to-float converter (16 per SM
// and clock on Hopper: 8 conversions per lane and step would bound decode below the memory
// rate): the float 2^23 + byte, assembled by one byte permute, minus 2^23 + bias.
__device__ __forceinline__ float byte_minus(uint32_t v, int k, float bias) {
  return __fsub_rn(__uint_as_float(__byte_perm(v, 0x4Bu, 0x4550u | uint32_t(k))),
                   8388608.0f + bias);
}
// Signed byte k of v as a float (the sign flip maps int8 b to the unsigned byte b + 128).
__device__ __forceinline__ float sbyte(uint32_t v, int k) {
  return byte_minus(v ^ 0x80808080u, k, 128.0f);
}

// A lane's activations: the float4 at p (x[0..3]) or zeros when !valid (p is then any in-row
// address: the load stays inside the row, the values are dropped).
__device__ __forceinline__ void load_x4(const float* p, bool valid, float* x) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(p));
  x[0] = valid ? v.x : 0.f;
  x[1] = valid ? v.y : 0.f;
  x[2] = valid ? v.z : 0.f;
  x[3] = valid ? v.w : 0.f;
}

// load_x and store of the codecs whose lane takes V consecutive columns per step (the plain float
// types and bf16): column (step * 32 + lane) * V, V = 4 or 1.
template <int V>
struct ConsecutiveColumns {
  int cols;
  __device__ void load_x(const float* xrow, int st, int lane, float* x) const {
    const int c = (st * 32 + lane) * V;
    const bool valid = c < cols;
    if constexpr (V == 4) {
      load_x4(xrow + (valid ? c : 0), valid, x);
    } else {
      const float v = __ldg(xrow + (valid ? c : 0));
      x[0] = valid ? v : 0.f;
    }
  }
  __device__ void store(float* out, int st, int lane, const float* w) const {
    const int c = (st * 32 + lane) * V;
    if (c >= cols) return;
#pragma unroll
    for (int e = 0; e < V; ++e) out[c + e] = w[e];
  }
};

// Block (row tile, group g): each warp owns RW weight rows; for each tile of MT of the group's
// token rows it walks the columns once, every lane dequantising Codec::kElems weights per row
// and step and multiplying them into MT accumulators per row, so each weight load serves MT
// tokens. Token tiles after the first re-read the block's rows from L1/L2, not HBM.
// Codec: kElems; Codec(const uint8_t* matrix, int cols); steps(); load_w(row, step, lane, w[]);
// load_x(const float* xrow, step, lane, x[]) (zeros where the lane's slice is past the row);
// store(float* out_row, step, lane, w[]) writes the lane's weights where load_x reads (none past
// the row).
template <class Codec, int MT, int RW>
__global__ void __launch_bounds__(kGemmWarps * 32) expert_gemm_kernel(GemmArgs a) {
  constexpr int E = Codec::kElems;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = blockIdx.y;
  const int row_base = (blockIdx.x * kGemmWarps + warp) * RW;
  if (row_base >= a.rows) return;
  const bool grouped = a.row_start != nullptr;
  const int t_begin = grouped ? a.row_start[g] : g * a.dense_chunk;
  const int t_end = grouped ? a.row_start[g + 1] : min(a.n_tokens, t_begin + a.dense_chunk);
  if (t_begin >= t_end) return;  // an expert no token chose
  const Codec codec(grouped ? a.w[g] + a.matrix_offset : a.matrix, a.cols);
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
// up to 8 for prefill. Rows per warp: 2 at MT 1 (more blocks for a single-row decode), else 4;
// 1 for a dense decode (one group), whose grid would otherwise leave most SMs idle.
template <class Codec>
void launch_expert_gemm(const GemmArgs& a, int n_groups, int max_rows_per_group, const char* name,
                        cudaStream_t s) {
  const auto launch = [&](auto mt, auto rw) {
    constexpr int MT = decltype(mt)::value, RW = decltype(rw)::value;
    const int rows_per_block = kGemmWarps * RW;
    const dim3 grid(unsigned((a.rows + rows_per_block - 1) / rows_per_block), unsigned(n_groups));
    expert_gemm_kernel<Codec, MT, RW><<<grid, kGemmWarps * 32, 0, s>>>(a);
  };
  if (max_rows_per_group <= 1 && n_groups == 1)
    launch(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
  else if (max_rows_per_group <= 1)
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

// dequantize_rows: one warp per output row, walking the codec's steps and storing what load_w
// decodes where load_x would read the matching activations (Codec::store). The codecs round as
// the CPU reference does (no fused multiply-add), so the rows are bit-identical to it.
struct DequantArgs {
  const uint8_t* w;
  int cols;
  const int* ids;
  int n;
  float* out;
};

template <class Codec>
__global__ void __launch_bounds__(kGemmWarps * 32) dequantize_rows_kernel(DequantArgs a) {
  const int i = blockIdx.x * kGemmWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (i >= a.n) return;
  const Codec codec(a.w, a.cols);
  const int row = a.ids[i];
  float* out = a.out + size_t(i) * a.cols;
  for (int st = 0; st < codec.steps(); ++st) {
    float wv[Codec::kElems];
    codec.load_w(row, st, lane, wv);
    codec.store(out, st, lane, wv);
  }
}

template <class Codec>
void launch_dequantize_rows(const DequantArgs& a, const char* name, cudaStream_t s) {
  const unsigned blocks = unsigned((a.n + kGemmWarps - 1) / kGemmWarps);
  dequantize_rows_kernel<Codec><<<blocks, kGemmWarps * 32, 0, s>>>(a);
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) throw_cuda(e, name, __FILE__, __LINE__);
}

// Launchers (preconditions asserted; the op wrappers in expert_gemm.cu check shapes).
void expert_gemm_q8_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s);
void expert_gemm_q4_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group, cudaStream_t s);
void expert_gemm_bf16_cuda(const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s);
void dequantize_rows_q8_cuda(const DequantArgs& a, cudaStream_t s);
void dequantize_rows_q4_cuda(const DequantArgs& a, cudaStream_t s);
void dequantize_rows_bf16_cuda(const DequantArgs& a, cudaStream_t s);
// The q8 types' product on the int8 tensor cores (gemm_q8_mma.cu; GemmKernel::kInt8Mma): the
// pack's q8 and ggml's Q8_0 with cols % 128 == 0 on compute capability 8.0 and later; it rounds
// x as round_activations does for q.
bool gemm_q8_mma_fits(QuantType q, int cols);
void gemm_q8_mma_cuda(QuantType q, const GemmArgs& a, int n_groups, int max_rows_per_group,
                      cudaStream_t s);
// ggml's types by family, each false for a type outside it: expert_gemm_plain.cu (F32, F16),
// expert_gemm_ggml_legacy.cu (the 32-element blocks and NVFP4), expert_gemm_ggml_kquants.cu (the
// 256-element K-quant super-blocks), expert_gemm_ggml_iquants.cu (the lattice and ternary
// super-blocks). BF16 is the pack's bf16 encoding.
bool gemm_plain_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                     cudaStream_t s);
bool dequantize_rows_plain_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s);
bool gemm_ggml_legacy_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s);
bool dequantize_rows_ggml_legacy_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s);
bool gemm_ggml_kquant_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s);
bool dequantize_rows_ggml_kquant_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s);
bool gemm_ggml_iquant_cuda(GgmlType t, const GemmArgs& a, int n_groups, int max_rows_per_group,
                           cudaStream_t s);
bool dequantize_rows_ggml_iquant_cuda(GgmlType t, const DequantArgs& a, cudaStream_t s);

}  // namespace moestream::gpu
