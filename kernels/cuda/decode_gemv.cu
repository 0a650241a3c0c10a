// The decode GEMV (decode_gemv.cuh): a warp per output row, each lane loading 16-byte chunks of
// the row (q8: 16 quants of a block, q4: one 32-element block, bf16: 8 weights), kGemvBatch of
// them before using any, so a warp has up to 2 KiB of its row in flight. The tile-loop GEMM of
// expert_gemm.cuh reads 4 bytes per lane and step, which at one token row per expert left the
// q8 experts at 0.75-1.4 TB/s on an H200 (docs/results.md, issue 19).
#include <algorithm>
#include <string>

#include "kernels/cuda/decode_gemv.cuh"
#include "kernels/cuda/expert_gemm.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {
namespace {

constexpr int kGemvWarps = 4;  // small blocks: a 512-row matrix still spreads over 128 SMs
// Chunks per lane in flight: 4 x 16 bytes x 32 lanes = 2 KiB per warp, a whole q8 row of width
// 2048 (its 2 KiB of quants) in one batch.
constexpr int kGemvBatch = 4;

// q8/q4 rows (loader/format/expert_file.h): nb f16 scales, then nb blocks of kQuantBytes bytes
// (q8: 32 int8 quants; q4: 16 bytes of nibbles). Chunk c is quant bytes 16c..16c+15, of block
// 16c / kQuantBytes. Needs nb % 8 == 0 (rows and quants 16-byte aligned).
template <int kQuantBytes>
struct PackRows {
  const uint8_t* m;
  int nb;
  size_t row_bytes;
  __device__ PackRows(const uint8_t* matrix, int cols)
      : m(matrix), nb(cols / 32), row_bytes(size_t(cols / 32) * (2 + kQuantBytes)) {}
  __device__ int chunks() const { return nb * kQuantBytes / 16; }
  __device__ uint4 load(int row, int c) const {
    return __ldg(reinterpret_cast<const uint4*>(m + size_t(row) * row_bytes + 2 * size_t(nb) +
                                                size_t(c) * 16));
  }
  __device__ float scale(int row, int c) const {
    return load_half(m + size_t(row) * row_bytes + 2 * size_t(c * 16 / kQuantBytes));
  }
};

// s + sum_e (byte e of v - bias) * x[e], e = 0..3 in order (bytes to floats by byte_minus: no
// int-to-float converter).
__device__ __forceinline__ float fma_bytes(uint32_t v, float bias, float4 x, float s) {
  s = fmaf(byte_minus(v, 0, bias), x.x, s);
  s = fmaf(byte_minus(v, 1, bias), x.y, s);
  s = fmaf(byte_minus(v, 2, bias), x.z, s);
  return fmaf(byte_minus(v, 3, bias), x.w, s);
}

// q8: chunk c is quants 16c..16c+15, half of block c/2.
struct Q8Chunks : PackRows<32> {
  static constexpr int kElems = 16;
  using PackRows<32>::PackRows;
  // sum_j q_j x_j over the chunk (the scale applied by the caller); x 16-byte aligned.
  __device__ static float dot(uint4 q, const float* x) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = fma_bytes(q.x ^ 0x80808080u, 128.0f, __ldg(x4), 0.f);  // int8 b as byte b + 128
    s = fma_bytes(q.y ^ 0x80808080u, 128.0f, __ldg(x4 + 1), s);
    s = fma_bytes(q.z ^ 0x80808080u, 128.0f, __ldg(x4 + 2), s);
    return fma_bytes(q.w ^ 0x80808080u, 128.0f, __ldg(x4 + 3), s);
  }
};

// q4: byte j of a block holds element j (low nibble) and j+16 (high), stored +8. Chunk c is
// block c.
struct Q4Chunks : PackRows<16> {
  static constexpr int kElems = 32;
  using PackRows<16>::PackRows;
  __device__ static float dot(uint4 q, const float* x) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // bytes 4k..4k+3: elements 4k.. (low), 16+4k.. (high)
      s = fma_bytes(w[k] & 0x0f0f0f0fu, 8.0f, __ldg(x4 + k), s);
      s = fma_bytes((w[k] >> 4) & 0x0f0f0f0fu, 8.0f, __ldg(x4 + 4 + k), s);
    }
    return s;
  }
};

// bf16 rows: cols bfloat16 (the upper half of a float32). Chunk c is weights 8c..8c+7. Needs
// cols % 8 == 0.
struct Bf16Chunks {
  static constexpr int kElems = 8;
  const uint8_t* m;
  int cols;
  __device__ Bf16Chunks(const uint8_t* matrix, int c) : m(matrix), cols(c) {}
  __device__ int chunks() const { return cols / 8; }
  __device__ uint4 load(int row, int c) const {
    return __ldg(reinterpret_cast<const uint4*>(m + (size_t(row) * cols + size_t(c) * 8) * 2));
  }
  __device__ float scale(int, int) const { return 1.0f; }
  __device__ static float dot(uint4 q, const float* x) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float4 v = __ldg(x4 + k);
      s = fmaf(__uint_as_float(w[2 * k] << 16), v.x, s);
      s = fmaf(__uint_as_float(w[2 * k] & 0xffff0000u), v.y, s);
      s = fmaf(__uint_as_float(w[2 * k + 1] << 16), v.z, s);
      s = fmaf(__uint_as_float(w[2 * k + 1] & 0xffff0000u), v.w, s);
    }
    return s;
  }
};

// float32 rows (the router, float32 packs' dense matrices): chunk c is weights 4c..4c+3. Needs
// cols % 4 == 0.
struct F32Chunks {
  static constexpr int kElems = 4;
  const uint8_t* m;
  int cols;
  __device__ F32Chunks(const uint8_t* matrix, int c) : m(matrix), cols(c) {}
  __device__ int chunks() const { return cols / 4; }
  __device__ uint4 load(int row, int c) const {
    return __ldg(reinterpret_cast<const uint4*>(m + (size_t(row) * cols + size_t(c) * 4) * 4));
  }
  __device__ float scale(int, int) const { return 1.0f; }
  __device__ static float dot(uint4 q, const float* x) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x));
    float s = __uint_as_float(q.x) * v.x;
    s = fmaf(__uint_as_float(q.y), v.y, s);
    s = fmaf(__uint_as_float(q.z), v.z, s);
    return fmaf(__uint_as_float(q.w), v.w, s);
  }
};

// Warp-row v of the launch: matrix m (by a.first), then group g and row r of that matrix.
// Lane l takes chunks l, l+32, ... in batches of kGemvBatch; a batch slot past the row is
// skipped warp-uniformly or (the row's last partial slot) loads the last chunk and adds nothing.
template <class Codec>
__global__ void __launch_bounds__(kGemvWarps * 32) decode_gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const long long v = (long long)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (v >= a.first[a.n_mats]) return;
  int mi = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxMats; ++i) mi += (i < a.n_mats && v >= a.first[i]) ? 1 : 0;
  const GemvMat& mt = a.mat[mi];
  const long long local = v - a.first[mi];
  const int g = int(local / mt.rows), r = int(local % mt.rows);
  const bool grouped = a.row_start != nullptr;
  const int t_begin = grouped ? a.row_start[g] : 0;
  const int t_end = grouped ? a.row_start[g + 1] : a.n_tokens;
  if (t_begin >= t_end) return;  // an expert no token chose
  const Codec codec(grouped ? a.w[g] + mt.offset : mt.matrix, a.cols);
  const int nc = codec.chunks();
  for (int t = t_begin; t < t_end; ++t) {
    const float* xt = mt.x + size_t(t) * a.cols;
    float acc = 0.f;
    for (int c0 = 0; c0 < nc; c0 += 32 * kGemvBatch) {
      uint4 q[kGemvBatch];
      float d[kGemvBatch];
#pragma unroll
      for (int u = 0; u < kGemvBatch; ++u) {
        if (c0 + u * 32 >= nc) break;  // warp-uniform
        const int c = min(c0 + u * 32 + lane, nc - 1);
        q[u] = codec.load(r, c);
        d[u] = codec.scale(r, c);
      }
#pragma unroll
      for (int u = 0; u < kGemvBatch; ++u) {
        if (c0 + u * 32 >= nc) break;
        const int c = c0 + u * 32 + lane;
        const float part = d[u] * Codec::dot(q[u], xt + size_t(min(c, nc - 1)) * Codec::kElems);
        acc += c < nc ? part : 0.f;
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float* out = mt.y + size_t(t) * mt.rows + r;
      *out = mt.add ? *out + acc : acc;
    }
  }
}

template <class Codec>
void launch(const GemvArgs& a, const char* name, cudaStream_t s) {
  const long long blocks = (a.first[a.n_mats] + kGemvWarps - 1) / kGemvWarps;
  MOE_ASSERT(blocks > 0 && blocks < (1ll << 31), "decode_gemv_cuda: grid out of range");
  decode_gemv_kernel<Codec><<<unsigned(blocks), kGemvWarps * 32, 0, s>>>(a);
  const cudaError_t e = cudaPeekAtLastError();
  if (e != cudaSuccess) throw_cuda(e, name, __FILE__, __LINE__);
}

bool is_bf16(QuantType q) {
  const auto t = quant_ggml_type(q);
  return q == QuantType::kBF16 || (t && *t == GgmlType::kBF16);
}

bool is_q8_0(QuantType q) {
  const auto t = quant_ggml_type(q);
  return t && *t == GgmlType::kQ8_0;
}

}  // namespace

bool decode_gemv_fits(QuantType q, int cols) {
  if (cols <= 0) return false;
  if (is_q8_0(q)) return decode_gemv_q8_0_fits(cols);
  if (q == QuantType::kQ8 || q == QuantType::kQ4) return cols % 256 == 0;
  return is_bf16(q) && cols % 8 == 0;
}

void decode_gemv_cuda(QuantType q, GemvArgs a, cudaStream_t s) {
  MOE_ASSERT(decode_gemv_fits(q, a.cols) && a.n_mats >= 1 && a.n_mats <= kGemvMaxMats &&
                 a.n_groups >= 1 && a.n_tokens >= 1 && (a.w == nullptr) == (a.row_start == nullptr),
             "decode_gemv_cuda: bad arguments");
  a.first[0] = 0;
  for (int i = 0; i < a.n_mats; ++i) {
    const GemvMat& m = a.mat[i];
    MOE_ASSERT(m.rows > 0 && m.x && m.y && reinterpret_cast<uintptr_t>(m.x) % 16 == 0 &&
                   (a.w ? m.offset % 16 == 0
                        : m.matrix && reinterpret_cast<uintptr_t>(m.matrix) % 16 == 0),
               "decode_gemv_cuda: matrix, offset or x not 16-byte aligned");
    a.first[i + 1] = a.first[i] + (long long)m.rows * (a.w ? a.n_groups : 1);
  }
  for (int i = a.n_mats + 1; i <= kGemvMaxMats; ++i) a.first[i] = a.first[a.n_mats];
  if (is_q8_0(q)) return decode_gemv_q8_0_cuda(a, s);  // counts its own CTAs in `first`
  if (q == QuantType::kQ8) return launch<Q8Chunks>(a, "launch of decode_gemv_kernel<q8>", s);
  if (q == QuantType::kQ4) return launch<Q4Chunks>(a, "launch of decode_gemv_kernel<q4>", s);
  launch<Bf16Chunks>(a, "launch of decode_gemv_kernel<bf16>", s);
}

void gemv_f32(const float* w, int rows, int cols, const float* x, float* y, bool add, Stream s) {
  if (rows <= 0 || cols <= 0 || cols % 4 != 0)
    throw Error("gpu::gemv_f32: bad shape rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                " (cols a multiple of 4)");
  if (!w || !x || !y) throw Error("gpu::gemv_f32: null device pointer");
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw Error("gpu::gemv_f32: w and x must be 16-byte aligned");
  GemvArgs a;
  a.mat[0] = GemvMat{reinterpret_cast<const uint8_t*>(w), 0, rows, x, y, add};
  a.n_mats = 1;
  a.cols = cols;
  a.first[1] = a.first[2] = a.first[3] = rows;
  launch<F32Chunks>(a, "launch of decode_gemv_kernel<f32>", s);
}

}  // namespace moestream::gpu
