// The product of a q8 weight matrix and many token rows on the int8 tensor cores: ggml's Q8_0
// (34-byte blocks: f16 scale, 32 int8) and the pack's q8 (per row nb f16 scales, then nb*32
// int8; loader/format/expert_file.h). Both store a weight row as int8 blocks of 32 with one scale,
// and the CPU's kernels round the input the same way (an int8 block of 32 and a scale), so a
// block's dot product is an exact integer: one mma.m16n8k32 (s8 x s8 -> s32) gives it for 16
// weight rows and 8 tokens, and the CTA adds (d_w * d_x) * isum over the blocks in float, the
// CPU kernel's arithmetic (the order of the sum over blocks aside). The float tile loop of
// expert_gemm.cuh does 32 multiply-adds on the CUDA cores for what one tensor-core op does here.
//
// A CTA (4 warps) takes 64 weight rows (16 a warp) and 32 token rows of one group (an expert's
// tokens, or a chunk of a dense product's), walking the columns in stages of 4 blocks. A row's
// stage is 136 bytes in either layout; it is copied as it is into shared memory with cp.async,
// two stages in flight, and the fragments are read from there (ggml's 2-byte aligned quants as
// two halves). The activations are read into registers one stage ahead and rounded into shared
// memory as round_activations rounds them (rounding is idempotent: a caller's rounded input gives
// the same int8 and scales).
#include <cuda_fp16.h>

#include <string>

#include "kernels/cuda/expert_gemm.cuh"

namespace moestream::gpu {
namespace {

constexpr int kThreads = kGemmWarps * 32;
constexpr int kRowsPerCta = 16 * kGemmWarps;  // weight rows: one m16 tile a warp
constexpr int kTokPerCta = 32;                // token rows: four n8 tiles
constexpr int kStageBlocks = 4;               // 32-blocks per stage of the column loop
constexpr int kStageCols = kStageBlocks * 32;
constexpr int kStageBytes = kStageBlocks * 34;  // a row's stage in either layout: 136 bytes
constexpr int kStageChunks = kStageBytes / 8;   // copied as 17 chunks of 8 bytes
constexpr int kPitch = 144;                   // shared row pitch: 36 words, conflict-free fragments
constexpr int kXLoads = kTokPerCta * kStageCols / 4 / kThreads;  // float4s a thread, a stage
static_assert(kTokPerCta * kStageCols / 4 % kThreads == 0 && kPitch % 16 == 0 && kPitch >= kStageBytes);

struct Smem {
  uint8_t w[2][kRowsPerCta][kPitch];  // two stages of raw weight bytes
  int8_t xq[kTokPerCta][kPitch];      // this stage's rounded activations
  float xs[kTokPerCta][kStageBlocks]; // and their scales
};

__device__ __forceinline__ float half_at(const uint8_t* p) {  // p 2-byte aligned
  return __half2float(*reinterpret_cast<const __half*>(p));
}
__device__ __forceinline__ uint32_t word_at(const uint8_t* p) {  // p 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(p);
}

// ggml Q8_0: a row's stage s is its blocks 4s..4s+3, bytes [136 s, 136 s + 136) of the row.
// Block kb of it: scale at 34 kb, quants at 34 kb + 2 (4-byte aligned for odd kb only).
// Activations: f16 scales (llama.cpp's q8_0).
struct GgmlQ8_0Rows {
  static constexpr bool kF16ActScale = true;
  __device__ static const uint8_t* chunk(const uint8_t* row, int /*nb*/, int s, int k) {
    return row + size_t(kStageBytes) * s + 8 * k;
  }
  __device__ static float scale(const uint8_t* st, int kb) { return half_at(st + 34 * kb); }
  __device__ static uint32_t quants(const uint8_t* st, int kb, int off) {
    const uint8_t* p = st + 34 * kb + 2 + off;
    if (kb & 1) return word_at(p);
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
  }
};

// The pack's q8: a row's stage s is its 4 scales (8 bytes at 8 s), then its 128 quants (at
// 2 nb + 128 s), copied as one 136-byte run. Activations: float scales
// (kernels/cpu/quant.cpp quantize_activations).
struct PackQ8Rows {
  static constexpr bool kF16ActScale = false;
  __device__ static const uint8_t* chunk(const uint8_t* row, int nb, int s, int k) {
    return k == 0 ? row + 8 * size_t(s) : row + 2 * size_t(nb) + size_t(kStageCols) * s + 8 * (k - 1);
  }
  __device__ static float scale(const uint8_t* st, int kb) { return half_at(st + 2 * kb); }
  __device__ static uint32_t quants(const uint8_t* st, int kb, int off) {
    return word_at(st + 8 + 32 * kb + off);
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MOE_INT8_MMA 1
#endif

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
#ifdef MOE_INT8_MMA
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src));
#else
  __trap();  // the host takes this kernel only on compute capability 8.0 and later
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef MOE_INT8_MMA
  asm volatile("cp.async.commit_group;\n");
#endif
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef MOE_INT8_MMA
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

__device__ __forceinline__ void mma_s8(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&c)[4]) {
#ifdef MOE_INT8_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
#else
  __trap();
#endif
}

template <class Rows>
__global__ void __launch_bounds__(kThreads) gemm_q8_mma_kernel(GemmArgs a) {
  __shared__ __align__(16) Smem sm;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int grp = blockIdx.y;
  const bool grouped = a.row_start != nullptr;
  const int g_begin = grouped ? a.row_start[grp] : grp * a.dense_chunk;
  const int g_end = grouped ? a.row_start[grp + 1] : min(a.n_tokens, g_begin + a.dense_chunk);
  const int r0 = int(blockIdx.x) * kRowsPerCta;
  const uint8_t* m = grouped ? a.w[grp] + a.matrix_offset : a.matrix;
  const int nb = a.cols / 32, n_stages = nb / kStageBlocks;
  const size_t row_bytes = size_t(nb) * 34;

  // Stage s of the CTA's weight rows into buffer s & 1 (rows past the matrix repeat its last).
  auto copy_weights = [&](int s) {
    for (int i = tid; i < kRowsPerCta * kStageChunks; i += kThreads) {
      const int r = i / kStageChunks, k = i % kStageChunks;
      const uint8_t* row = m + size_t(min(r0 + r, a.rows - 1)) * row_bytes;
      cp_async8(&sm.w[s & 1][r][8 * k], Rows::chunk(row, nb, s, k));
    }
    cp_async_commit();
  };
  float4 xr[kXLoads];  // a warp holds one token's 128 columns a load: lane l has columns 4l..4l+3
  auto load_x = [&](int s, int t0, int n_tok) {
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int tok = i * kGemmWarps + warp;
      xr[i] = tok < n_tok ? __ldg(reinterpret_cast<const float4*>(
                                a.x + size_t(t0 + tok) * a.cols + size_t(s) * kStageCols) + lane)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  // The registers rounded per 32-block (8 consecutive lanes hold a block) into xq and xs.
  auto round_x = [&] {
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int tok = i * kGemmWarps + warp;
      const float v[4] = {xr[i].x, xr[i].y, xr[i].z, xr[i].w};
      float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
      float d = __fdiv_rn(amax, 127.0f);
      if (Rows::kF16ActScale) d = __half2float(__float2half_rn(d));
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = int(rintf(fminf(fmaxf(__fmul_rn(v[e], id), -127.0f), 127.0f)));
        packed |= uint32_t(q & 0xff) << (8 * e);
      }
      *reinterpret_cast<uint32_t*>(&sm.xq[tok][4 * lane]) = packed;
      if ((lane & 7) == 0) sm.xs[tok][lane >> 3] = d;
    }
  };

  const int wrow = warp * 16 + g;
  // Token tiles z, z + gridDim.z, ...: the grid's z covers max_rows_per_group, a hint.
  for (int t0 = g_begin + int(blockIdx.z) * kTokPerCta; t0 < g_end; t0 += int(gridDim.z) * kTokPerCta) {
    const int n_tok = min(kTokPerCta, g_end - t0);
    const int n_tiles = (n_tok + 7) / 8;
    float acc[4][4] = {};
    __syncthreads();  // the last tile's readers of both weight buffers are done
    copy_weights(0);
    load_x(0, t0, n_tok);
    for (int s = 0; s < n_stages; ++s) {
      __syncthreads();  // stage s - 1's readers of xq and of buffer (s + 1) & 1 are done
      if (s + 1 < n_stages) copy_weights(s + 1);
      round_x();
      if (s + 1 < n_stages) {
        load_x(s + 1, t0, n_tok);  // in flight while this stage computes
        cp_async_wait<1>();        // stage s's weights are in; s + 1's may still be copying
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const uint8_t* wa = sm.w[s & 1][wrow];
#pragma unroll
      for (int kb = 0; kb < kStageBlocks; ++kb) {
        // A (16 rows x 32): rows g and g + 8, columns 4t..4t+3 and 16+4t..16+4t+3.
        const uint32_t fa[4] = {Rows::quants(wa, kb, 4 * t), Rows::quants(wa + 8 * kPitch, kb, 4 * t),
                                Rows::quants(wa, kb, 16 + 4 * t),
                                Rows::quants(wa + 8 * kPitch, kb, 16 + 4 * t)};
        const float dw0 = Rows::scale(wa, kb), dw1 = Rows::scale(wa + 8 * kPitch, kb);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          if (nt >= n_tiles) break;  // warp-uniform
          // B (32 x 8 tokens): token g, columns 4t..4t+3 and 16+4t..16+4t+3.
          const int8_t* pb = &sm.xq[nt * 8 + g][kb * 32 + 4 * t];
          int c[4];
          mma_s8(fa, *reinterpret_cast<const uint32_t*>(pb), *reinterpret_cast<const uint32_t*>(pb + 16), c);
          // C: rows g (c0, c1) and g + 8 (c2, c3), tokens 2t and 2t + 1.
          const float dx0 = sm.xs[nt * 8 + 2 * t][kb], dx1 = sm.xs[nt * 8 + 2 * t + 1][kb];
          acc[nt][0] += __fmul_rn(__fmul_rn(dw0, dx0), float(c[0]));
          acc[nt][1] += __fmul_rn(__fmul_rn(dw0, dx1), float(c[1]));
          acc[nt][2] += __fmul_rn(__fmul_rn(dw1, dx0), float(c[2]));
          acc[nt][3] += __fmul_rn(__fmul_rn(dw1, dx1), float(c[3]));
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int tok = nt * 8 + 2 * t + (k & 1), row = r0 + wrow + (k >> 1) * 8;
        if (tok < n_tok && row < a.rows) a.y[size_t(t0 + tok) * a.rows + row] = acc[nt][k];
      }
  }
}

bool device_has_int8_mma() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 8;
  }();
  return yes;
}

}  // namespace

bool gemm_q8_mma_fits(QuantType q, int cols) {
  const auto t = quant_ggml_type(q);
  const bool q8 = q == QuantType::kQ8 || (t && *t == GgmlType::kQ8_0);
  return q8 && cols > 0 && cols % kStageCols == 0 && device_has_int8_mma();
}

void gemm_q8_mma_cuda(QuantType q, const GemmArgs& a, int n_groups, int max_rows_per_group,
                      cudaStream_t s) {
  MOE_ASSERT(gemm_args_ok(a) && a.cols % kStageCols == 0 && n_groups > 0 && n_groups <= 65535 &&
                 max_rows_per_group > 0 && a.matrix_offset % 16 == 0,
             "gemm_q8_mma_cuda: bad arguments");
  const dim3 grid(unsigned((a.rows + kRowsPerCta - 1) / kRowsPerCta), unsigned(n_groups),
                  unsigned((max_rows_per_group + kTokPerCta - 1) / kTokPerCta));
  MOE_ASSERT(grid.z <= 65535, "gemm_q8_mma_cuda: too many token rows in a group");
  if (q == QuantType::kQ8)
    gemm_q8_mma_kernel<PackQ8Rows><<<grid, kThreads, 0, s>>>(a);
  else
    gemm_q8_mma_kernel<GgmlQ8_0Rows><<<grid, kThreads, 0, s>>>(a);
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess)
    throw_cuda(e, q == QuantType::kQ8 ? "launch of gemm_q8_mma_kernel<q8>" : "launch of gemm_q8_mma_kernel<Q8_0>",
               __FILE__, __LINE__);
}

}  // namespace moestream::gpu
