// Multi-head latent attention kernels (kernels/cuda/mla_ops.h): the latent cache append, the
// absorbed query, the attention over cached latents (flash-decoding splits, merged in order) and
// the value up-projection. wkv_b is read in its stored element type (f32, bf16, f16): no float
// copy of it exists on the device. References: runtime/model/mla_attention.cpp and the plain
// loops of tests/gpu_mla_test.cpp.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/mla_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kThreads = 128;  // 4 warps: the attention block's warps take every 4th key
constexpr int kWarps = kThreads / 32;
constexpr int kTok = 8;  // tokens per block of the wkv_b kernels: each weight load serves 8 tokens
// The attention grid aims at this many blocks (about 8 per SM of an H200): a decode token of 128
// heads gets 8 key splits, a prefill chunk of 64 tokens one.
constexpr int kTargetBlocks = 1024;
constexpr int kMaxSplits = 64;
constexpr int kMinKeysPerSplit = 64;  // below this a split's launch costs more than its keys
// Value rows per block of mla_value_out: a decode token of 128 heads x 128 rows gets 1,024 blocks
// instead of one per head (128 blocks of 4 warps leave most of the device's load slots idle).
constexpr int kValueRows = 16;

// One element of a stored wkv_b row.
struct F32W {
  static __device__ __forceinline__ float at(const uint8_t* row, int c) { return reinterpret_cast<const float*>(row)[c]; }
  static constexpr int kBytes = 4;
};
struct Bf16W {
  static __device__ __forceinline__ float at(const uint8_t* row, int c) {
    return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[c]) << 16);
  }
  static constexpr int kBytes = 2;
};
struct F16W {
  static __device__ __forceinline__ float at(const uint8_t* row, int c) {
    return __half2float(reinterpret_cast<const __half*>(row)[c]);
  }
  static constexpr int kBytes = 2;
};

template <class Fn>
void with_weight_type(QuantType q, const char* op, Fn&& fn) {
  if (q == QuantType::kF32 || q == ggml_quant(GgmlType::kF32)) fn(F32W{});
  else if (q == ggml_quant(GgmlType::kBF16)) fn(Bf16W{});
  else if (q == ggml_quant(GgmlType::kF16)) fn(F16W{});
  else
    throw ConfigError(std::string("gpu::") + op + ": wkv_b of type " + std::string(quant_name(q)) +
                      " is read through an f32 copy (mla_reads_type)");
}

// Block per token: RMSNorm of the latent, RoPE of the shared key, into the cache row.
__global__ void mla_cache_append_kernel(const float* __restrict__ kv, const float* __restrict__ norm, float eps,
                                        const float* __restrict__ cos, const float* __restrict__ sin, int C, int r,
                                        float* __restrict__ rows) {
  const int t = blockIdx.x, lat = C + r, half = r / 2;
  const float* x = kv + size_t(t) * lat;
  float* out = rows + size_t(t) * lat;
  float ss = 0;
  for (int i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(C) + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) out[i] = x[i] * inv * norm[i];
  const float* ct = cos + size_t(t) * half;
  const float* st = sin + size_t(t) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = x[C + i], b = x[C + half + i];
    out[C + i] = a * ct[i] - b * st[i];
    out[C + half + i] = b * ct[i] + a * st[i];
  }
}

// Block (column tile of 128, head h, token tile): q_abs[t][h][c] = sum_i q[t][h][i] W[h(n+v)+i][c],
// the weight row read once per token tile (coalesced along c); the column-tile-0 block also
// writes the head's rotated RoPE part.
template <class W>
__global__ void mla_absorb_q_kernel(const float* __restrict__ q, const uint8_t* __restrict__ w, int T, int H, int n,
                                    int r, int v, int C, const float* __restrict__ cos,
                                    const float* __restrict__ sin, float* __restrict__ q_abs) {
  extern __shared__ float qs[];  // [kTok][n]
  const int h = blockIdx.y, t0 = blockIdx.z * kTok, nt = min(kTok, T - t0);
  const int qk = n + r, lat = C + r, half = r / 2;
  for (int k = threadIdx.x; k < kTok * n; k += blockDim.x) {
    const int tt = k / n, i = k - tt * n;
    qs[k] = tt < nt ? q[(size_t(t0 + tt) * H + h) * qk + i] : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) {
    float acc[kTok];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) acc[tt] = 0.0f;
    const size_t row_bytes = size_t(C) * W::kBytes;
    const uint8_t* rows = w + size_t(h) * size_t(n + v) * row_bytes;
    for (int i = 0; i < n; ++i) {
      const float wv = W::at(rows + size_t(i) * row_bytes, c);
#pragma unroll
      for (int tt = 0; tt < kTok; ++tt) acc[tt] += qs[tt * n + i] * wv;
    }
    for (int tt = 0; tt < nt; ++tt) q_abs[(size_t(t0 + tt) * H + h) * lat + c] = acc[tt];
  }
  if (blockIdx.x == 0) {
    for (int k = threadIdx.x; k < nt * half; k += blockDim.x) {
      const int tt = k / half, i = k - tt * half, t = t0 + tt;
      const float* qr = q + (size_t(t) * H + h) * qk + n;
      float* out = q_abs + (size_t(t) * H + h) * lat + C;
      const float a = qr[i], b = qr[half + i];
      const float cs = cos[size_t(t) * half + i], sn = sin[size_t(t) * half + i];
      out[i] = a * cs - b * sn;
      out[half + i] = b * cs + a * sn;
    }
  }
}

// Block (query row t*H + h, split): warps take keys j = k0 + warp, k0 + warp + 4, ... of the
// split; a lane holds dims lane + 32 i of the query and of each key row, so the row it loads for
// the score is the row it accumulates (d < C) without a second read. Online softmax per warp,
// then the 4 warps merge in shared memory; the split writes [acc(C) | max | sum] unnormalised.
template <int NL>
__global__ void __launch_bounds__(kThreads) mla_attention_kernel(const float* __restrict__ q_abs,
                                                                 const float* __restrict__ cache, int H, int pos0,
                                                                 int C, int lat, float scale, int keys_per_split,
                                                                 int n_rows, float* __restrict__ partial) {
  __shared__ float acc_s[kWarps][NL * 32];
  __shared__ float m_s[kWarps], l_s[kWarps];
  const int row = blockIdx.x, split = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int len = pos0 + row / H + 1;  // causal: keys [0, len)
  const int k0 = split * keys_per_split, k1 = min(k0 + keys_per_split, len);
  const float* qr = q_abs + size_t(row) * lat;
  float qv[NL], acc[NL];
#pragma unroll
  for (int i = 0; i < NL; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < lat ? qr[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = k0 + warp; j < k1; j += kWarps) {
    const float* kr = cache + size_t(j) * lat;
    float kv[NL];
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < NL; ++i) {
      const int d = lane + 32 * i;
      kv[i] = d < lat ? kr[d] : 0.0f;
      part += qv[i] * kv[i];
    }
    const float s = warp_sum(part) * scale;
    const float mn = fmaxf(m, s);
    const float corr = expf(m - mn);  // m = -inf on the first key: 0
    const float p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < NL; ++i) acc[i] = acc[i] * corr + p * kv[i];
    m = mn;
  }
#pragma unroll
  for (int i = 0; i < NL; ++i) acc_s[warp][lane + 32 * i] = acc[i];
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w]);
  float wt[kWarps], sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    wt[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - mx);  // a warp with no key weighs nothing
    sum += l_s[w] * wt[w];
  }
  float* out = partial + (size_t(split) * n_rows + row) * size_t(C + 2);
  for (int d = threadIdx.x; d < C; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) a += acc_s[w][d] * wt[w];
    out[d] = a;
  }
  if (threadIdx.x == 0) {
    out[C] = mx;
    out[C + 1] = sum;
  }
}

// Block per query row: the splits' partials weighed against their common max, in split order.
__global__ void mla_merge_kernel(const float* __restrict__ partial, int n_rows, int n_splits, int C,
                                 float* __restrict__ ctx) {
  __shared__ float wt[kMaxSplits];
  __shared__ float inv_s;
  const int row = blockIdx.x;
  const size_t stride = size_t(n_rows) * size_t(C + 2);
  const float* p = partial + size_t(row) * size_t(C + 2);
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, p[s * stride + C]);
    float sum = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float ms = p[s * stride + C];
      wt[s] = ms == -INFINITY ? 0.0f : expf(ms - mx);  // an empty split weighs nothing
      sum += p[s * stride + C + 1] * wt[s];
    }
    inv_s = 1.0f / sum;  // split 0 holds key 0 of every row: sum > 0
  }
  __syncthreads();
  for (int d = threadIdx.x; d < C; d += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < n_splits; ++s) a += p[s * stride + d] * wt[s];
    ctx[size_t(row) * C + d] = a * inv_s;
  }
}

// Block (head h, token tile, row slice): warps take the slice's value rows k = k0 + warp,
// k0 + warp + 4, ...; lanes stride the row (coalesced) against the tile's latents in shared memory.
template <class W>
__global__ void mla_value_out_kernel(const float* __restrict__ ctx, const uint8_t* __restrict__ w, int T, int H,
                                     int n, int v, int C, float* __restrict__ o) {
  extern __shared__ float cs[];  // [kTok][C]
  const int h = blockIdx.x, t0 = blockIdx.y * kTok, nt = min(kTok, T - t0);
  for (int k = threadIdx.x; k < kTok * C; k += blockDim.x) {
    const int tt = k / C, c = k - tt * C;
    cs[k] = tt < nt ? ctx[(size_t(t0 + tt) * H + h) * C + c] : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t row_bytes = size_t(C) * W::kBytes;
  const int k_end = min(v, int(blockIdx.z + 1) * kValueRows);
  for (int k = int(blockIdx.z) * kValueRows + warp; k < k_end; k += kWarps) {
    const uint8_t* wr = w + (size_t(h) * size_t(n + v) + size_t(n + k)) * row_bytes;
    float acc[kTok];
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) acc[tt] = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float wv = W::at(wr, c);
#pragma unroll
      for (int tt = 0; tt < kTok; ++tt) acc[tt] += wv * cs[tt * C + c];
    }
#pragma unroll
    for (int tt = 0; tt < kTok; ++tt) acc[tt] = warp_sum(acc[tt]);
    if (lane == 0)
      for (int tt = 0; tt < nt; ++tt) o[size_t(t0 + tt) * H * v + size_t(h) * v + k] = acc[tt];
  }
}

// Key splits of a chunk: enough blocks to fill the device, each split at least kMinKeysPerSplit
// keys; rows * splits never exceeds max(rows, kTargetBlocks) (the partial buffer's size).
int splits_for(int n_rows, int max_len) {
  int s = std::max(1, kTargetBlocks / n_rows);
  s = std::min({s, kMaxSplits, (max_len + kMinKeysPerSplit - 1) / kMinKeysPerSplit});
  return std::max(s, 1);
}

template <int NL>
void launch_attention(const float* q_abs, const float* cache, int T, int pos0, int H, int C, int lat, float scale,
                      float* partial, float* ctx, cudaStream_t s) {
  const int n_rows = T * H, max_len = pos0 + T;
  const int splits = splits_for(n_rows, max_len);
  const int kps = (max_len + splits - 1) / splits;
  mla_attention_kernel<NL><<<dim3(unsigned(n_rows), unsigned(splits)), kThreads, 0, s>>>(
      q_abs, cache, H, pos0, C, lat, scale, kps, n_rows, partial);
  MOE_CUDA_CHECK_LAUNCH("mla_attention_kernel");
  mla_merge_kernel<<<unsigned(n_rows), kThreads, 0, s>>>(partial, n_rows, splits, C, ctx);
  MOE_CUDA_CHECK_LAUNCH("mla_merge_kernel");
}

void check_shape(const char* op, bool ok, const std::string& what) {
  if (!ok) throw Error(std::string("gpu::") + op + ": bad shape " + what);
}

std::string dims(int T, int H, int n, int r, int v, int C) {
  return "T=" + std::to_string(T) + " H=" + std::to_string(H) + " n=" + std::to_string(n) + " r=" +
         std::to_string(r) + " v=" + std::to_string(v) + " C=" + std::to_string(C);
}

}  // namespace

bool mla_reads_type(QuantType q) {
  return q == QuantType::kF32 || q == ggml_quant(GgmlType::kF32) || q == ggml_quant(GgmlType::kBF16) ||
         q == ggml_quant(GgmlType::kF16);
}

size_t mla_attention_partial_floats(int T, int H, int C) {
  return size_t(std::max(T * H, kTargetBlocks)) * size_t(C + 2);
}

void mla_cache_append(const float* kv, const float* norm, float eps, const float* cos, const float* sin, int T, int C,
                      int r, float* rows, Stream s) {
  check_shape("mla_cache_append", T > 0 && C > 0 && r > 0 && r % 2 == 0 && eps >= 0,
              dims(T, 1, 0, r, 0, C));
  if (!kv || !norm || !cos || !sin || !rows) throw Error("gpu::mla_cache_append: null device pointer");
  mla_cache_append_kernel<<<unsigned(T), 256, 0, s>>>(kv, norm, eps, cos, sin, C, r, rows);
  MOE_CUDA_CHECK_LAUNCH("mla_cache_append_kernel");
}

void mla_absorb_q(const float* q, QuantType wt, const uint8_t* wkv_b, int T, int H, int n, int r, int v, int C,
                  const float* cos, const float* sin, float* q_abs, Stream s) {
  check_shape("mla_absorb_q", T > 0 && H > 0 && n > 0 && n <= kMlaMaxLatent && r > 0 && r % 2 == 0 && v > 0 && C > 0 && H <= 65535 &&
                                  (T + kTok - 1) / kTok <= 65535,
              dims(T, H, n, r, v, C));
  if (!q || !wkv_b || !cos || !sin || !q_abs) throw Error("gpu::mla_absorb_q: null device pointer");
  const dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned(H), unsigned((T + kTok - 1) / kTok));
  const size_t smem = size_t(kTok) * size_t(n) * sizeof(float);
  with_weight_type(wt, "mla_absorb_q", [&](auto w) {
    using W = decltype(w);
    mla_absorb_q_kernel<W><<<grid, kThreads, smem, s>>>(q, wkv_b, T, H, n, r, v, C, cos, sin, q_abs);
  });
  MOE_CUDA_CHECK_LAUNCH("mla_absorb_q_kernel");
}

void mla_attention(const float* q_abs, const float* cache, int T, int pos0, int H, int C, int r, float scale,
                   float* partial, float* ctx, Stream s) {
  const int lat = C + r;
  check_shape("mla_attention", T > 0 && pos0 >= 0 && H > 0 && C > 0 && r >= 0 && lat <= kMlaMaxLatent,
              dims(T, H, 0, r, 0, C) + " pos0=" + std::to_string(pos0) + " (C + r at most " +
                  std::to_string(kMlaMaxLatent) + ")");
  if (!q_abs || !cache || !partial || !ctx) throw Error("gpu::mla_attention: null device pointer");
  const int nl = (lat + 31) / 32;  // floats of a row per lane
  if (nl <= 1) launch_attention<1>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);
  else if (nl <= 2) launch_attention<2>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);
  else if (nl <= 4) launch_attention<4>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);
  else if (nl <= 8) launch_attention<8>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);
  else if (nl <= 18) launch_attention<18>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);  // 576
  else launch_attention<32>(q_abs, cache, T, pos0, H, C, lat, scale, partial, ctx, s);
}

void mla_value_out(const float* ctx, QuantType wt, const uint8_t* wkv_b, int T, int H, int n, int v, int C,
                   float* o, Stream s) {
  check_shape("mla_value_out", T > 0 && H > 0 && n > 0 && v > 0 && C > 0 && C <= kMlaMaxLatent && H <= 65535 &&
                                   (T + kTok - 1) / kTok <= 65535 && (v + kValueRows - 1) / kValueRows <= 65535,
              dims(T, H, n, 0, v, C));
  if (!ctx || !wkv_b || !o) throw Error("gpu::mla_value_out: null device pointer");
  const dim3 grid(unsigned(H), unsigned((T + kTok - 1) / kTok), unsigned((v + kValueRows - 1) / kValueRows));
  const size_t smem = size_t(kTok) * size_t(C) * sizeof(float);  // 32 KiB at C = 1024
  with_weight_type(wt, "mla_value_out", [&](auto w) {
    using W = decltype(w);
    mla_value_out_kernel<W><<<grid, kThreads, smem, s>>>(ctx, wkv_b, T, H, n, v, C, o);
  });
  MOE_CUDA_CHECK_LAUNCH("mla_value_out_kernel");
}

}  // namespace moestream::gpu
