// The decode GEMV of ggml's Q8_0 (decode_gemv.cuh): 34-byte blocks (f16 scale, 32 int8) that
// start only 2-byte aligned. Loading them a word at a time, as the tile loop does, spreads a
// warp's loads over 9 cache lines per instruction; the L1, not the memory, then bounds the
// product near 1.8 TB/s on an H200 (docs/results.md, issue 19). Here a warp reads its row in
// segments of 32 blocks (1088 bytes, 68 aligned 16-byte chunks, three loads per lane), stores the
// segment in shared memory and gives each lane one block of it; the next two segments' loads are
// in flight while the lane computes. The activations are rounded to q8_0 once per CTA in shared memory
// (the CPU's rounding: ggml_legacy.cpp), so a block's dot product is eight __dp4a and one scale:
// sum over blocks of (d_w * d_x) * isum, as the CPU's kernel computes it (the order of the sum
// over blocks differs: a lane takes every 32nd block, then the warp adds the lanes).
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/expert_gemm.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kBlockBytes = 34;
constexpr int kSegBlocks = 32;                          // one block per lane
constexpr int kSegBytes = kSegBlocks * kBlockBytes;     // 1088: 68 chunks of 16 bytes
constexpr int kStageBytes = kSegBytes + 16;             // the last lane's 9th word reads past it
constexpr int kMaxTokens = 4;                           // token rows rounded into shared memory at once
constexpr int kSmemBudget = 48 * 1024;                  // the default dynamic shared memory limit

struct Q8Layout {
  int cols, nb, n_tok;  // n_tok: token rows per pass (<= kMaxTokens)
  // Shared memory: xq [n_tok][cols] int8 | xd [n_tok][nb] float | stage [kWarps][kStageBytes].
  __host__ __device__ size_t xd_offset() const { return size_t(n_tok) * cols; }
  __host__ __device__ size_t stage_offset() const { return xd_offset() + size_t(n_tok) * nb * 4; }
  __host__ __device__ size_t bytes() const { return stage_offset() + size_t(kWarps) * kStageBytes; }
};

// Token rows [t0, t0 + nt) of x rounded as the CPU rounds Q8_0's input (round_activations.cu's
// block kernel): per 32-block, d = f16(amax / 127), q = rint(x * 127 / amax). A warp per block,
// each warp loading kBatch of its blocks before reducing any (one memory latency, not kBatch).
__device__ void round_tokens(const float* x, int t0, int nt, const Q8Layout& L, int8_t* xq, float* xd) {
  constexpr int kBatch = 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int total = nt * L.nb;
  for (int i0 = warp; i0 < total; i0 += kWarps * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kWarps, t = i / L.nb, b = i % L.nb;
      v[k] = i < total ? x[size_t(t0 + t) * L.cols + size_t(b) * 32 + lane] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kWarps, t = i / L.nb, b = i % L.nb;
      if (i >= total) break;  // warp-uniform
      const float amax = warp_max(fabsf(v[k]));
      const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
      const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
      const float q = rintf(fminf(fmaxf(__fmul_rn(v[k], id), -127.0f), 127.0f));
      xq[size_t(t) * L.cols + size_t(b) * 32 + lane] = int8_t(q);
      if (lane == 0) xd[t * L.nb + b] = d;
    }
  }
}

// CTA v of the launch: matrix m (by a.first, here CTA counts), then group g and the CTA's rows
// [r0, r1) of that matrix (rpc rows a CTA, warps taking every kWarps-th row).
__global__ void __launch_bounds__(kWarps * 32) decode_gemv_q8_0_kernel(GemvArgs a, Q8Layout L, int rpc) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long v = blockIdx.x;
  int mi = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxMats; ++i) mi += (i < a.n_mats && v >= a.first[i]) ? 1 : 0;
  const GemvMat& mt = a.mat[mi];
  const int ctas_per_group = (mt.rows + rpc - 1) / rpc;
  const long long local = v - a.first[mi];
  const int g = int(local / ctas_per_group);
  const int r0 = int(local % ctas_per_group) * rpc, r1 = min(mt.rows, r0 + rpc);
  const bool grouped = a.row_start != nullptr;
  const int t_begin = grouped ? a.row_start[g] : 0;
  const int t_end = grouped ? a.row_start[g + 1] : a.n_tokens;
  if (t_begin >= t_end) return;  // an expert no token chose: the whole CTA leaves
  const uint8_t* w = grouped ? a.w[g] + mt.offset : mt.matrix;
  const size_t row_bytes = size_t(L.nb) * kBlockBytes;
  const int n_seg = (L.nb + kSegBlocks - 1) / kSegBlocks;
  auto* xq = reinterpret_cast<int8_t*>(smem);
  auto* xd = reinterpret_cast<float*>(smem + L.xd_offset());
  uint8_t* stage = smem + L.stage_offset() + size_t(warp) * kStageBytes;
  const int my_rows = r0 + warp < r1 ? (r1 - (r0 + warp) + kWarps - 1) / kWarps : 0;
  const int n_items = my_rows * n_seg;  // (row, segment) pairs of this warp, in order

  // Item i's chunks: this lane's three of the segment's (16 per lane-chunk; the segment's last
  // may hold fewer blocks, always whole chunks: nb % 8 == 0).
  auto load_item = [&](int i, uint4* c) {
    const int row = r0 + warp + (i / n_seg) * kWarps, seg = i % n_seg;
    const int blocks = min(kSegBlocks, L.nb - seg * kSegBlocks);
    const int chunks = blocks * kBlockBytes / 16;
    const auto* src = reinterpret_cast<const uint4*>(w + size_t(row) * row_bytes + size_t(seg) * kSegBytes);
#pragma unroll
    for (int k = 0; k < 3; ++k)
      if (lane + 32 * k < chunks) c[k] = __ldg(src + lane + 32 * k);
  };

  for (int t0 = t_begin; t0 < t_end; t0 += L.n_tok) {
    const int nt = min(L.n_tok, t_end - t0);
    // Two items ahead: their loads are in flight while the input is rounded, then while each
    // segment computes (a warp's items are a chain; without them, its latencies add up).
    uint4 c[3], c_next[3];
    if (n_items > 0) load_item(0, c);
    if (n_items > 1) load_item(1, c_next);
    __syncthreads();  // the previous pass's readers of xq are done
    round_tokens(mt.x, t0, nt, L, xq, xd);
    __syncthreads();
    float acc[kMaxTokens] = {};
    for (int i = 0; i < n_items; ++i) {
      const int seg = i % n_seg;
      const int blocks = min(kSegBlocks, L.nb - seg * kSegBlocks);
      const int chunks = blocks * kBlockBytes / 16;
      __syncwarp();  // the last item's readers of the stage are done
#pragma unroll
      for (int k = 0; k < 3; ++k)
        if (lane + 32 * k < chunks) reinterpret_cast<uint4*>(stage)[lane + 32 * k] = c[k];
      __syncwarp();
#pragma unroll
      for (int k = 0; k < 3; ++k) c[k] = c_next[k];
      if (i + 2 < n_items) load_item(i + 2, c_next);
      if (lane < blocks) {
        // Block `lane`: scale at byte 34*lane (2-byte aligned), quants at 34*lane + 2: words
        // from the aligned word below, shifted by 16 bits when the quants start mid-word.
        const int qbyte = kBlockBytes * lane + 2;
        const auto* wd = reinterpret_cast<const uint32_t*>(stage + (qbyte & ~3));
        const uint32_t shift = uint32_t(qbyte & 3) * 8;
        uint32_t word[9];
#pragma unroll
        for (int j = 0; j < 9; ++j) word[j] = wd[j];
        const float dw = __half2float(*reinterpret_cast<const __half*>(stage + kBlockBytes * lane));
        const int b = seg * kSegBlocks + lane;
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) {
          if (t >= nt) break;
          const int4* xv = reinterpret_cast<const int4*>(xq + size_t(t) * L.cols + size_t(b) * 32);
          const int4 x0 = xv[0], x1 = xv[1];
          const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          int isum = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) isum = __dp4a(int(__funnelshift_r(word[j], word[j + 1], shift)), xs[j], isum);
          acc[t] += __fmul_rn(__fmul_rn(dw, xd[t * L.nb + b]), float(isum));
        }
      }
      if (seg == n_seg - 1) {  // the row is done
        const int row = r0 + warp + (i / n_seg) * kWarps;
#pragma unroll
        for (int t = 0; t < kMaxTokens; ++t) {
          if (t >= nt) break;
          const float s = warp_sum(acc[t]);
          acc[t] = 0.0f;
          if (lane == 0) {
            float* out = mt.y + size_t(t0 + t) * mt.rows + row;
            *out = mt.add ? *out + s : s;
          }
        }
      }
    }
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return std::max(count, 1);
  }();
  return n;
}

}  // namespace

bool decode_gemv_q8_0_fits(int cols) {
  if (cols <= 0 || cols % 256 != 0) return false;
  const Q8Layout one{cols, cols / 32, 1};
  return one.bytes() <= size_t(kSmemBudget);
}

void decode_gemv_q8_0_cuda(GemvArgs a, cudaStream_t s) {
  Q8Layout L{a.cols, a.cols / 32, kMaxTokens};
  while (L.n_tok > 1 && L.bytes() > size_t(kSmemBudget)) --L.n_tok;
  MOE_ASSERT(decode_gemv_q8_0_fits(a.cols), "decode_gemv_q8_0_cuda: cols not a fit");
  // Rows a CTA: about three CTAs per multiprocessor over the launch (as many as its 80 registers a
  // thread let run at once), at least a row per warp.
  long long rows = 0;
  for (int i = 0; i < a.n_mats; ++i) rows += (long long)a.mat[i].rows * (a.w ? a.n_groups : 1);
  const long long target = 3LL * sm_count();
  long long rpc = std::max<long long>(kWarps, (rows + target - 1) / target);
  rpc = (rpc + kWarps - 1) / kWarps * kWarps;
  a.first[0] = 0;
  for (int i = 0; i < a.n_mats; ++i) {
    const long long per_group = (a.mat[i].rows + rpc - 1) / rpc;
    a.first[i + 1] = a.first[i] + per_group * (a.w ? a.n_groups : 1);
  }
  for (int i = a.n_mats + 1; i <= kGemvMaxMats; ++i) a.first[i] = a.first[a.n_mats];
  const long long blocks = a.first[a.n_mats];
  MOE_ASSERT(blocks > 0 && blocks < (1ll << 31), "decode_gemv_q8_0_cuda: grid out of range");
  decode_gemv_q8_0_kernel<<<unsigned(blocks), kWarps * 32, L.bytes(), s>>>(a, L, int(rpc));
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) throw_cuda(e, "launch of decode_gemv_q8_0_kernel", __FILE__, __LINE__);
}

}  // namespace moestream::gpu
