// Causal grouped-query attention over one layer's float32 KV cache, flash-decoding style: the
// context is split across blocks (each keeps an online softmax), then a second kernel merges.
// gpt-oss: per-head sink logits join the final normalisation, a sliding window masks old keys, and
// a sliding layer's cache may be a ring (key position p in row p % ring).
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace moestream::gpu {
namespace {

constexpr int kWarps = 4;  // warps per block; each takes every 4th tile of the block's keys
constexpr int kTile = 32;  // keys per warp tile: one score per lane in the softmax step
// Blocks per SM the split aims for: 8 blocks of 4 warps fill an SM's 64 warp slots at half
// occupancy, enough loads in flight to reach HBM bandwidth on a 4-KV-head decode.
constexpr int kBlocksPerSm = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxSplits = 1024;  // the merge kernel weighs splits in shared memory
// Bytes the default pool keeps across synchronizations: the split partials of a 40k-token decode
// (splits * heads * (head_dim + 2) floats) are a few MiB.
constexpr uint64_t kPoolKeepBytes = uint64_t(64) << 20;

struct AttnArgs {
  const float* q;
  const float* k;
  const float* v;
  int n_q, pos0, n_heads, n_kv, hd, group;
  float scale;
  int n_rows;          // n_q * group: query rows that read one KV head
  int keys_per_split;  // a multiple of kTile
  int n_splits;
  float* out;       // final output (n_splits == 1)
  float* part_acc;  // [n_splits][n_q * n_heads][hd] unnormalised partial outputs
  float* part_ml;   // [n_splits][n_q * n_heads][2]: running max and sum of exponentials
  const float* sinks;  // [n_heads] or null
  int window;          // keys a query sees (0: all)
  int key0;            // first key any row sees (window: pos0 + 1 - window); splits start here
  int ring;            // rows of a ring cache (position p in row p % ring); 0: row p is position p
};

// The cache row of key position j.
__device__ __forceinline__ int cache_row(int j, int ring) { return ring > 0 ? j % ring : j; }

// The final normalisation with an optional sink logit: o / (sum + e^(sink - mx)), formed against
// the larger of mx and the sink as the CPU does (no overflow when the sink dominates).
__device__ __forceinline__ float4 normalise_with_sink(float4 o, float mx, float sum, const float* sinks, int h) {
  float scale_o = 1.0f;
  if (sinks != nullptr) {
    const float sink = sinks[h];
    const float m2 = fmaxf(mx, sink);
    scale_o = expf(mx - m2);
    sum = sum * scale_o + expf(sink - m2);
  }
  const float inv = scale_o / sum;
  return make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
}

// Block (row tile, kv head g, split): RB query rows (token-major over the group's heads) against
// keys [split * keys_per_split, ...) up to the last row's causal limit. NK float4s per lane cover
// a key row in the score step (8 lanes per key, 4 keys per step); the PV step maps lanes to
// dimensions, (NK + 3) / 4 float4s each.
// At least 3 blocks (12 warps) per SM for decode-sized row tiles (head_dim <= 128): the loops need
// several warps' loads in flight; RB 16 and head_dim 256 would spill too much under that cap.
template <int RB, int NK>
__global__ void __launch_bounds__(kWarps * 32, (RB >= 16 || NK > 4) ? 1 : 3)
    attention_kernel(AttnArgs a) {
  constexpr int NV = (NK + 3) / 4;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int hd = a.hd, hd4 = hd / 4;
  // Main loop: q rows and per-warp score tiles. After it the same space holds each warp's
  // accumulators for the merge (q is no longer read then).
  float* q_s = smem;                          // [RB][hd]
  float* sc_all = q_s + RB * hd;              // [kWarps][RB][kTile]
  float* acc_s = smem;                        // [kWarps][RB][hd], after the loop
  const int region = max(RB * hd + kWarps * RB * kTile, kWarps * RB * hd);
  float* m_s = smem + region;                 // [kWarps][RB]
  float* l_s = m_s + kWarps * RB;             // [kWarps][RB]

  const int g = blockIdx.y, row0 = blockIdx.x * RB, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  int limit[RB], first[RB];  // keys [first, limit) are visible to row r (limit 0: a padding row)
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    const int row = row0 + r;
    limit[r] = row < a.n_rows ? a.pos0 + row / a.group + 1 : 0;
    first[r] = a.window > 0 ? max(0, limit[r] - a.window) : 0;
  }
  const int last_row = min(row0 + RB, a.n_rows) - 1;
  const int k_block_end = a.pos0 + last_row / a.group + 1;

  for (int i = threadIdx.x; i < RB * hd4; i += blockDim.x) {
    const int r = i / hd4, d4 = i - r * hd4, row = row0 + r;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < a.n_rows) {
      const int t = row / a.group, h = g * a.group + row % a.group;
      v = reinterpret_cast<const float4*>(a.q + (size_t(t) * a.n_heads + h) * hd)[d4];
    }
    reinterpret_cast<float4*>(q_s)[i] = v;
  }
  __syncthreads();

  const int k_begin = a.key0 + split * a.keys_per_split;
  const int k_end = min(k_begin + a.keys_per_split, k_block_end);
  const size_t key_stride = size_t(a.n_kv) * hd;  // floats between positions
  const float* kbase = a.k + size_t(g) * hd;
  const float* vbase = a.v + size_t(g) * hd;
  float* sc = sc_all + warp * RB * kTile;
  const float4* q4 = reinterpret_cast<const float4*>(q_s);

  float m[RB], l[RB];
  float4 acc[RB][NV];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[r][i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const int kk = lane >> 3, l8 = lane & 7;
  for (int t0 = k_begin + warp * kTile; t0 < k_end; t0 += kWarps * kTile) {
    const int n_tile = min(kTile, k_end - t0);
    // Scores: 8 lanes per key, so a key row's float4 loads coalesce into 128-byte segments.
    // Loads are branch-free (indices clamped to valid memory, values zeroed) so that a step's
    // loads issue back to back; fewer steps in flight for large RB to stay in registers.
    constexpr int kUnrollA = RB >= 8 ? 2 : 4;
#pragma unroll kUnrollA
    for (int st = 0; st < kTile / 4; ++st) {
      const int jj = st * 4 + kk, j = t0 + jj;
      const int jc = jj < n_tile ? j : t0;  // a key past the tile reads key t0, masked below
      float part[RB];
#pragma unroll
      for (int r = 0; r < RB; ++r) part[r] = 0.f;
      const float4* kr = reinterpret_cast<const float4*>(kbase + size_t(cache_row(jc, a.ring)) * key_stride);
#pragma unroll
      for (int i = 0; i < NK; ++i) {
        const int d4 = l8 + 8 * i;
        const bool in = d4 < hd4;
        const int dc = in ? d4 : hd4 - 1;
        float4 kv = __ldg(kr + dc);
        if (!in) kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const float4 qv = q4[r * hd4 + dc];
          part[r] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
        }
      }
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        float s = part[r];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        if (l8 == 0)
          sc[r * kTile + jj] = (jj < n_tile && j < limit[r] && j >= first[r]) ? s * a.scale : -INFINITY;
      }
    }
    __syncwarp();
    // Online softmax, one key per lane: rescale the running sums once per tile.
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      const float s = sc[r * kTile + lane];
      const float m_new = fmaxf(m[r], warp_max(s));
      float p = 0.f, alpha = 1.f;
      if (m_new != -INFINITY) {
        p = expf(s - m_new);  // expf, not __expf: stay close to the CPU's std::exp
        alpha = expf(m[r] - m_new);
      }
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
      sc[r * kTile + lane] = p;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        acc[r][i].x *= alpha;
        acc[r][i].y *= alpha;
        acc[r][i].z *= alpha;
        acc[r][i].w *= alpha;
      }
    }
    __syncwarp();
    // P V: lanes over dimensions, a probability broadcast from shared memory per (row, key).
#pragma unroll 8
    for (int jj = 0; jj < n_tile; ++jj) {
      const float4* vr = reinterpret_cast<const float4*>(vbase + size_t(cache_row(t0 + jj, a.ring)) * key_stride);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int d4 = lane + 32 * i;
        // Lanes past head_dim read the row's last float4 and add nothing (acc is not stored).
        const float4 vv = __ldg(vr + (d4 < hd4 ? d4 : hd4 - 1));
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const float p = sc[r * kTile + jj];
          acc[r][i].x += p * vv.x;
          acc[r][i].y += p * vv.y;
          acc[r][i].z += p * vv.z;
          acc[r][i].w += p * vv.w;
        }
      }
    }
    __syncwarp();  // the next tile overwrites sc
  }

  __syncthreads();  // acc_s aliases q_s and the score tiles
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (lane == 0) {
      m_s[warp * RB + r] = m[r];
      l_s[warp * RB + r] = l[r];
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int d4 = lane + 32 * i;
      if (d4 < hd4) reinterpret_cast<float4*>(acc_s + (warp * RB + r) * hd)[d4] = acc[r][i];
    }
  }
  __syncthreads();

  // Merge the warps (fixed order), then write the output or this split's partial.
  for (int i = threadIdx.x; i < RB * hd4; i += blockDim.x) {
    const int r = i / hd4, d4 = i - r * hd4, row = row0 + r;
    if (row >= a.n_rows) continue;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w * RB + r]);
    float sum = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float mw = m_s[w * RB + r];
        if (mw == -INFINITY) continue;
        const float e = expf(mw - mx);
        sum += l_s[w * RB + r] * e;
        const float4 aw = reinterpret_cast<const float4*>(acc_s + (w * RB + r) * hd)[d4];
        o.x += aw.x * e;
        o.y += aw.y * e;
        o.z += aw.z * e;
        o.w += aw.w * e;
      }
    }
    const int t = row / a.group, h = g * a.group + row % a.group;
    const size_t orow = size_t(t) * a.n_heads + h;
    if (a.n_splits == 1) {  // sum >= 1: the row's own key is visible to it
      reinterpret_cast<float4*>(a.out + orow * hd)[d4] = normalise_with_sink(o, mx, sum, a.sinks, h);
    } else {
      const size_t prow = size_t(split) * a.n_q * a.n_heads + orow;
      reinterpret_cast<float4*>(a.part_acc + prow * hd)[d4] = o;
      if (d4 == 0) {
        a.part_ml[2 * prow] = mx;
        a.part_ml[2 * prow + 1] = sum;
      }
    }
  }
}

// One block per (token, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). Threads
// first weigh the splits in parallel, then warps take every kWarps-th split with lanes over
// float4s of the head, and the warps' sums are added in warp order (deterministic).
__global__ void __launch_bounds__(kWarps * 32)
    attention_merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                           int n_splits, int n_out_rows, int hd, float* __restrict__ out,
                           const float* __restrict__ sinks, int n_heads) {
  __shared__ float e_s[kMaxSplits];
  __shared__ float red[kWarps];
  __shared__ float4 acc_s[kWarps][kMaxHeadDim / 4];
  const size_t orow = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd4 = hd / 4;

  float mx = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x)
    mx = fmaxf(mx, part_ml[2 * (size_t(s) * n_out_rows + orow)]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();  // red is reused below

  float l = 0.f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const size_t prow = size_t(s) * n_out_rows + orow;
    const float ms = part_ml[2 * prow];
    const float e = ms == -INFINITY ? 0.f : expf(ms - mx);  // -inf: past this row's limit
    e_s[s] = e;
    l += part_ml[2 * prow + 1] * e;
  }
  l = warp_sum(l);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float sum = 0.f;
  for (int w = 0; w < kWarps; ++w) sum += red[w];

  for (int d4 = lane; d4 < hd4; d4 += 32) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = warp; s < n_splits; s += kWarps) {
      const float e = e_s[s];
      const float* src = part_acc + (size_t(s) * n_out_rows + orow) * hd;
      const float4 a = __ldg(reinterpret_cast<const float4*>(src) + d4);
      o.x += a.x * e;
      o.y += a.y * e;
      o.z += a.z * e;
      o.w += a.w * e;
    }
    acc_s[warp][d4] = o;
  }
  __syncthreads();
  for (int d4 = threadIdx.x; d4 < hd4; d4 += blockDim.x) {
    float4 o = acc_s[0][d4];
    for (int w = 1; w < kWarps; ++w) {
      o.x += acc_s[w][d4].x;
      o.y += acc_s[w][d4].y;
      o.z += acc_s[w][d4].z;
      o.w += acc_s[w][d4].w;
    }
    reinterpret_cast<float4*>(out + orow * hd)[d4] = normalise_with_sink(o, mx, sum, sinks, int(orow % n_heads));
  }
}

template <int RB, int NK>
void launch_attention(const AttnArgs& a, dim3 grid, size_t smem, cudaStream_t s) {
  attention_kernel<RB, NK><<<grid, kWarps * 32, smem, s>>>(a);
  MOE_CUDA_CHECK_LAUNCH("attention_kernel");
}

template <int NK>
void dispatch_rb(int rb, const AttnArgs& a, dim3 grid, size_t smem, cudaStream_t s) {
  switch (rb) {
    case 1: return launch_attention<1, NK>(a, grid, smem, s);
    case 2: return launch_attention<2, NK>(a, grid, smem, s);
    case 4: return launch_attention<4, NK>(a, grid, smem, s);
    case 8: return launch_attention<8, NK>(a, grid, smem, s);
    case 16:
      if constexpr (NK <= 4) return launch_attention<16, NK>(a, grid, smem, s);
      break;
  }
  MOE_ASSERT(false, "attention_cuda: no kernel for this row tile");
}

int sm_count() {
  int dev = 0, n = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  MOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

}  // namespace

void attention_cuda(const float* q, const float* k_cache, const float* v_cache, int n_q, int pos0,
                    int n_heads, int n_kv_heads, int head_dim, float scale, float* out,
                    cudaStream_t s, const float* sinks, int window, int ring,
                    float* scratch, size_t scratch_floats) {
  MOE_ASSERT(q && k_cache && v_cache && out && n_q > 0 && pos0 >= 0 && n_kv_heads > 0 &&
                 n_heads % n_kv_heads == 0 && head_dim % 4 == 0 && head_dim <= kMaxHeadDim,
             "attention_cuda: bad arguments");
  AttnArgs a{};
  a.q = q;
  a.k = k_cache;
  a.v = v_cache;
  a.n_q = n_q;
  a.pos0 = pos0;
  a.n_heads = n_heads;
  a.n_kv = n_kv_heads;
  a.hd = head_dim;
  a.group = n_heads / n_kv_heads;
  a.scale = scale;
  a.n_rows = n_q * a.group;
  a.out = out;
  a.sinks = sinks;
  a.window = window;
  a.ring = ring;

  const int nk = head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8;
  // A sliding layer's keys before the first row's window are never read.
  a.key0 = window > 0 ? std::max(0, pos0 + 1 - window) : 0;
  const long long n_keys = (long long)pos0 + n_q - a.key0;
  const long long tiles = (n_keys + kTile - 1) / kTile;
  // Rows per block: the whole GQA group of a decode token (K/V read once per KV head), capped
  // so the accumulators stay in registers. A decode token whose keys are too few to split
  // over half the GPU's multiprocessors splits its group instead: each block then reads the
  // KV head again (from L2), and its warps' chain of softmax and P V steps is RB times shorter.
  int rb = 1;
  while (rb < a.n_rows && rb < (nk <= 4 ? 16 : 8)) rb *= 2;
  const int sms = sm_count();
  const long long most_splits = std::min<long long>((tiles + kWarps - 1) / kWarps, kMaxSplits);
  while (n_q == 1 && rb > 1 &&
         (long long)((a.n_rows + rb - 1) / rb) * n_kv_heads * most_splits < sms / 2)
    rb /= 2;
  const int row_tiles = (a.n_rows + rb - 1) / rb;

  // Split the keys so that the grid fills the GPU, each warp getting at least one tile.
  const long long base = (long long)row_tiles * n_kv_heads;
  long long splits = (kBlocksPerSm * (long long)sms + base - 1) / base;
  splits = std::max(1LL, std::min(splits, most_splits));
  const long long tiles_per_split = (tiles + splits - 1) / splits;
  splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  a.keys_per_split = int(tiles_per_split * kTile);
  a.n_splits = int(splits);

  const int region = std::max(rb * head_dim + kWarps * rb * kTile, kWarps * rb * head_dim);
  const size_t smem = size_t(region + 2 * kWarps * rb) * sizeof(float);
  const dim3 grid{unsigned(row_tiles), unsigned(n_kv_heads), unsigned(splits)};
  MOE_ASSERT(row_tiles < (1LL << 31) && n_kv_heads <= 65535 && splits <= 65535,
             "attention_cuda: grid too large");

  const size_t n_out_rows = size_t(n_q) * n_heads;
  const size_t acc_floats = size_t(splits) * n_out_rows * head_dim;
  const size_t part_floats = acc_floats + size_t(splits) * n_out_rows * 2;
  const bool own_scratch = splits > 1 && (scratch == nullptr || part_floats > scratch_floats);
  if (splits > 1 && !own_scratch) {
    a.part_acc = scratch;
    a.part_ml = a.part_acc + acc_floats;
  } else if (own_scratch) {
    // Stream-ordered scratch from the device's default memory pool: no sync, and safe when
    // several streams run attention at once. The pool's release threshold is raised so that a
    // per-token synchronize does not hand the pages back to the driver (and map them again on
    // the next token).
    void* pool_scratch = nullptr;
    int dev = 0;
    cudaMemPool_t pool = nullptr;
    MOE_CUDA_CHECK(cudaGetDevice(&dev));
    MOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = 0;
    MOE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    if (keep < kPoolKeepBytes) {
      keep = kPoolKeepBytes;
      MOE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    MOE_CUDA_CHECK(cudaMallocAsync(&pool_scratch, part_floats * sizeof(float), s));
    a.part_acc = static_cast<float*>(pool_scratch);
    a.part_ml = a.part_acc + acc_floats;
  }
  switch (nk) {
    case 2: dispatch_rb<2>(rb, a, grid, smem, s); break;
    case 4: dispatch_rb<4>(rb, a, grid, smem, s); break;
    default: dispatch_rb<8>(rb, a, grid, smem, s); break;
  }
  if (splits > 1) {
    attention_merge_kernel<<<unsigned(n_out_rows), kWarps * 32, 0, s>>>(
        a.part_acc, a.part_ml, a.n_splits, int(n_out_rows), head_dim, out, sinks, n_heads);
    MOE_CUDA_CHECK_LAUNCH("attention_merge_kernel");
    if (own_scratch) MOE_CUDA_CHECK(cudaFreeAsync(a.part_acc, s));
  }
}

void attention(const float* q, const float* k_cache, const float* v_cache, int n_q, int pos0,
               int n_heads, int n_kv_heads, int head_dim, float scale, float* out, Stream s,
               const float* sinks, int window, int ring, float* scratch, size_t scratch_floats) {
  const std::string shape = "n_q=" + std::to_string(n_q) + " pos0=" + std::to_string(pos0) +
                            " n_heads=" + std::to_string(n_heads) +
                            " n_kv_heads=" + std::to_string(n_kv_heads) +
                            " head_dim=" + std::to_string(head_dim);
  if (n_q <= 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
      (long long)pos0 + n_q > (1LL << 30))
    throw Error("gpu::attention: bad shape " + shape);
  if (n_heads % n_kv_heads != 0)
    throw Error("gpu::attention: n_heads must be a multiple of n_kv_heads (" + shape + ")");
  if (head_dim % 4 != 0 || head_dim > kMaxHeadDim)
    throw ConfigError("gpu::attention: head_dim must be a multiple of 4 and at most " +
                      std::to_string(kMaxHeadDim) + " (" + shape + ")");
  if (!(std::isfinite(scale) && scale > 0))
    throw Error("gpu::attention: bad scale " + std::to_string(scale));
  if (!q || !k_cache || !v_cache || !out) throw Error("gpu::attention: null device pointer");
  for (const void* p : {static_cast<const void*>(q), static_cast<const void*>(k_cache),
                        static_cast<const void*>(v_cache), static_cast<const void*>(out)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw Error("gpu::attention: device pointers must be 16-byte aligned (float4 loads)");
  if (window < 0) throw Error("gpu::attention: negative window " + std::to_string(window));
  // A ring must hold every key the chunk reads: the first query's window and the chunk's own keys.
  if (ring < 0 || (ring > 0 && (window == 0 || (long long)ring < (long long)window + n_q - 1)))
    throw Error("gpu::attention: a ring of " + std::to_string(ring) + " rows cannot hold window " +
                std::to_string(window) + " + the chunk's " + std::to_string(n_q) + " keys - 1 (" + shape + ")");
  if (scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
    throw Error("gpu::attention: scratch must be 16-byte aligned");
  attention_cuda(q, k_cache, v_cache, n_q, pos0, n_heads, n_kv_heads, head_dim, scale, out, s, sinks,
                 window, ring, scratch, scratch_floats);
}

size_t attention_scratch_floats(int n_q, int n_heads, int head_dim, int max_keys) {
  const long long tiles = ((long long)std::max(max_keys, 1) + kTile - 1) / kTile;
  const long long splits = std::min<long long>(kMaxSplits, (tiles + kWarps - 1) / kWarps);
  return size_t(splits) * size_t(n_q) * size_t(n_heads) * (size_t(head_dim) + 2);
}

}  // namespace moestream::gpu
