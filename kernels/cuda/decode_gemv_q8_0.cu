// The decode GEMV of ggml Q8_0 matrices (decode_gemv.cuh): integer dot products of the weights'
// int8 quants with the activations' own int8 quants (__dp4a), as ggml computes a Q8_0 row with
// q8_0 activations. A block of 8 warps takes 32 consecutive rows of one matrix (and group) for one
// token: it first quantizes that token's activation row into shared memory (32-wide blocks,
// d = amax / 127 rounded to float16, q = rint(x * 127 / amax): the rounding of
// round_activations.h, so an input already rounded there quantizes back to the same integers
// and scales), then each warp reduces 4 rows, 4 lanes per 34-byte block (8 quants each), 32
// blocks of its row in flight. The tile-loop GEMM decodes every weight to a float and reads 4
// floats of activations per 4 weights; here a weight byte meets one activation byte.
#include <cuda_fp16.h>

#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/expert_gemm.cuh"
#include "kernels/cuda/ggml_codec.cuh"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kUnroll = 4;        // 8 blocks per warp step, 4 steps in flight
constexpr int kBlockBytes = 34;   // f16 d, 32 int8

__host__ __device__ inline size_t xq_bytes(int cols) { return (size_t(cols) + 15) / 16 * 16; }

__global__ void __launch_bounds__(kWarps * 32) decode_gemv_q8_0_kernel(GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int cols = a.cols, nb = cols / 32;
  int8_t* xq = reinterpret_cast<int8_t*>(smem);
  float* xd = reinterpret_cast<float*>(smem + xq_bytes(cols));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long tile = blockIdx.x;
  int mi = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxMats; ++i) mi += (i < a.n_mats && tile >= a.first[i]) ? 1 : 0;
  const GemvMat& mt = a.mat[mi];
  const int tiles = (mt.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const long long local = tile - a.first[mi];
  const int g = int(local / tiles), r0 = int(local % tiles) * kRowsPerBlock;
  const bool grouped = a.row_start != nullptr;
  const int t_begin = grouped ? a.row_start[g] : 0;
  const int t_end = grouped ? a.row_start[g + 1] : a.n_tokens;
  const uint8_t* base = grouped ? a.w[g] + mt.offset : mt.matrix;
  const size_t row_bytes = size_t(nb) * kBlockBytes;
  const int sub = lane & 3, bl = lane >> 2;  // the lane's quarter of block bl of a step
  for (int t = t_begin; t < t_end; ++t) {    // block-uniform
    const float* xt = mt.x + size_t(t) * cols;
    for (int b = warp; b < nb; b += kWarps) {
      const float v = xt[size_t(b) * 32 + lane];
      const float amax = warp_max(fabsf(v));
      const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
      const float q = rintf(fminf(fmaxf(__fmul_rn(v, id), -127.0f), 127.0f));
      xq[b * 32 + lane] = static_cast<int8_t>(q);
      if (lane == 0) xd[b] = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    }
    __syncthreads();
    for (int j = 0; j < kRowsPerWarp; ++j) {
      const int r = r0 + warp * kRowsPerWarp + j;
      if (r >= mt.rows) break;  // warp-uniform
      const uint8_t* row = base + size_t(r) * row_bytes;
      float acc = 0.0f;
      for (int b0 = 0; b0 < nb; b0 += 8 * kUnroll) {
        uint32_t w0[kUnroll], w1[kUnroll];
        float dw[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int b = b0 + 8 * u + bl;
          if (b < nb) {
            const uint8_t* blk = row + size_t(b) * kBlockBytes;
            dw[u] = load_half(blk);
            w0[u] = ld_u32(blk + 2 + 8 * sub);
            w1[u] = ld_u32(blk + 6 + 8 * sub);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int b = b0 + 8 * u + bl;
          if (b < nb) {
            const int2 xv = *reinterpret_cast<const int2*>(xq + b * 32 + 8 * sub);
            const int s = __dp4a(int(w1[u]), xv.y, __dp4a(int(w0[u]), xv.x, 0));
            acc = fmaf(dw[u] * xd[b], float(s), acc);
          }
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) {
        float* out = mt.y + size_t(t) * mt.rows + r;
        *out = mt.add ? *out + acc : acc;
      }
    }
    __syncthreads();  // xq is rewritten for the next token
  }
}

}  // namespace

void decode_gemv_q8_0_cuda(GemvArgs a, cudaStream_t s) {
  MOE_ASSERT(a.cols > 0 && a.cols % 32 == 0 && a.n_mats >= 1 && a.n_mats <= kGemvMaxMats,
             "decode_gemv_q8_0_cuda: bad arguments");
  a.first[0] = 0;
  for (int i = 0; i < a.n_mats; ++i) {
    const GemvMat& m = a.mat[i];
    MOE_ASSERT(m.rows > 0 && m.x && m.y && (a.w || m.matrix), "decode_gemv_q8_0_cuda: bad matrix");
    const long long tiles = (m.rows + kRowsPerBlock - 1) / kRowsPerBlock;
    a.first[i + 1] = a.first[i] + tiles * (a.w ? a.n_groups : 1);
  }
  for (int i = a.n_mats + 1; i <= kGemvMaxMats; ++i) a.first[i] = a.first[a.n_mats];
  const long long blocks = a.first[a.n_mats];
  MOE_ASSERT(blocks > 0 && blocks < (1ll << 31), "decode_gemv_q8_0_cuda: grid out of range");
  const size_t smem = xq_bytes(a.cols) + size_t(a.cols / 32) * sizeof(float);
  if (smem > 48 * 1024)
    throw Error("gpu decode GEMV (Q8_0): " + std::to_string(a.cols) + " columns exceed its shared memory");
  decode_gemv_q8_0_kernel<<<unsigned(blocks), kWarps * 32, smem, s>>>(a);
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) throw_cuda(e, "launch of decode_gemv_q8_0_kernel", __FILE__, __LINE__);
}

}  // namespace moestream::gpu
