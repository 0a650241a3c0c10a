// Implementation of kernels/cpu/quant.h: quantise/dequantise the expert encodings, the scalar
// matvec reference, and the run-time choice between it and the AVX2 kernels.
#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "common/load_le.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream {
namespace {

constexpr int kHalfBlock = kQuantBlock / 2;

size_t n_blocks(size_t cols) { return (cols + kQuantBlock - 1) / kQuantBlock; }

// Block b of a row, zero padded past `cols`.
void load_block(const float* row, size_t cols, size_t b, float out[kQuantBlock]) {
  for (int i = 0; i < kQuantBlock; ++i) {
    size_t c = b * kQuantBlock + i;
    out[i] = c < cols ? row[c] : 0.0f;
  }
}

uint16_t load_u16(const uint8_t* p) { return load_le<uint16_t>(p); }

// Round to nearest (ties to even: nearbyint compiles to one instruction, lround is a libm call).
int8_t round_clamp(float v, float lo, float hi) {
  return static_cast<int8_t>(std::clamp(std::nearbyint(v), lo, hi));
}

void quantize_row_q8(const float* src, size_t cols, uint8_t* dst) {
  const size_t nb = n_blocks(cols);
  auto* qs = reinterpret_cast<int8_t*>(dst + nb * 2);
  float blk[kQuantBlock];
  for (size_t b = 0; b < nb; ++b) {
    load_block(src, cols, b, blk);
    float amax = 0;
    for (float v : blk) amax = std::max(amax, std::fabs(v));
    uint16_t dh = f32_to_f16(amax / 127.0f);
    // Quantise against the stored (rounded) scale: the decoder sees exactly that one.
    float d = f16_to_f32(dh);
    float id = d != 0 ? 1.0f / d : 0.0f;
    std::memcpy(dst + 2 * b, &dh, 2);
    for (int i = 0; i < kQuantBlock; ++i) qs[b * kQuantBlock + i] = round_clamp(blk[i] * id, -127.0f, 127.0f);
  }
}

void quantize_row_q4(const float* src, size_t cols, uint8_t* dst) {
  const size_t nb = n_blocks(cols);
  uint8_t* qs = dst + nb * 2;
  float blk[kQuantBlock];
  for (size_t b = 0; b < nb; ++b) {
    load_block(src, cols, b, blk);
    float m = 0;  // element of largest magnitude, sign kept: it maps exactly to nibble 0 (-8)
    for (float v : blk)
      if (std::fabs(v) > std::fabs(m)) m = v;
    uint16_t dh = f32_to_f16(m / -8.0f);
    float d = f16_to_f32(dh);
    float id = d != 0 ? 1.0f / d : 0.0f;
    std::memcpy(dst + 2 * b, &dh, 2);
    uint8_t* out = qs + b * kHalfBlock;
    for (int j = 0; j < kHalfBlock; ++j) {
      int lo = round_clamp(blk[j] * id, -8.0f, 7.0f) + 8;
      int hi = round_clamp(blk[j + kHalfBlock] * id, -8.0f, 7.0f) + 8;
      out[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace

void quantize_matrix(QuantType q, const float* src, size_t rows, size_t cols, uint8_t* dst) {
  if (quant_ggml_type(q))
    throw ConfigError("quantising to ggml type " + std::string(quant_name(q)) + " is not supported");
  switch (q) {
    case QuantType::kF32:
      std::memcpy(dst, src, rows * cols * 4);
      return;
    case QuantType::kBF16:
      for (size_t i = 0; i < rows * cols; ++i) {
        uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case QuantType::kQ8:
    case QuantType::kQ4: {
      const size_t row_bytes = quant_matrix_bytes(q, 1, cols);
      for (size_t r = 0; r < rows; ++r) {
        if (q == QuantType::kQ8) quantize_row_q8(src + r * cols, cols, dst + r * row_bytes);
        else quantize_row_q4(src + r * cols, cols, dst + r * row_bytes);
      }
      return;
    }
  }
  MOE_ASSERT(false, "bad QuantType");
}

void dequantize_matrix(QuantType q, const uint8_t* src, size_t rows, size_t cols, float* dst) {
  if (const auto g = quant_ggml_type(q)) {
    const size_t row_bytes = quant_matrix_bytes(q, 1, cols);
    for (size_t r = 0; r < rows; ++r) ggml_dequantize_row(*g, src + r * row_bytes, cols, dst + r * cols);
    return;
  }
  const size_t nb = n_blocks(cols);
  switch (q) {
    case QuantType::kF32:
      std::memcpy(dst, src, rows * cols * 4);
      return;
    case QuantType::kBF16:
      for (size_t i = 0; i < rows * cols; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case QuantType::kQ8:
    case QuantType::kQ4: {
      const size_t row_bytes = quant_matrix_bytes(q, 1, cols);
      for (size_t r = 0; r < rows; ++r) {
        const uint8_t* row = src + r * row_bytes;
        const uint8_t* qs = row + nb * 2;
        for (size_t c = 0; c < cols; ++c) {
          size_t b = c / kQuantBlock, i = c % kQuantBlock;
          float d = f16_to_f32(load_u16(row + 2 * b));
          int v;
          if (q == QuantType::kQ8) {
            v = static_cast<int8_t>(qs[c]);
          } else {
            uint8_t byte = qs[b * kHalfBlock + (i % kHalfBlock)];
            v = (i < static_cast<size_t>(kHalfBlock) ? (byte & 0xf) : (byte >> 4)) - 8;
          }
          dst[r * cols + c] = static_cast<float>(v) * d;
        }
      }
      return;
    }
  }
  MOE_ASSERT(false, "bad QuantType");
}

namespace detail {

void quantize_activations(const float* x, size_t cols, float* d, int8_t* qs, uint8_t* abs_qs,
                          float* sum8, int8_t* qs_pairs) {
  const size_t nb = n_blocks(cols);
  float blk[kQuantBlock];
  for (size_t b = 0; b < nb; ++b) {
    load_block(x, cols, b, blk);
    float amax = 0;
    for (float v : blk) amax = std::max(amax, std::fabs(v));
    d[b] = amax / 127.0f;
    float id = amax != 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      // nearbyint (ties to even) matches _mm256_round_ps in quantize_activations_avx2 bit for bit.
      int8_t q = static_cast<int8_t>(std::clamp(std::nearbyint(blk[i] * id), -127.0f, 127.0f));
      qs[b * kQuantBlock + i] = q;
      abs_qs[b * kQuantBlock + i] = static_cast<uint8_t>(q < 0 ? -q : q);
      sum += q;
    }
    sum8[b] = static_cast<float>(8 * sum);
  }
  for (size_t p = 0; p < nb / 2; ++p)
    for (int half = 0; half < 2; ++half)      // elements 0..15, then 16..31
      for (int blk = 0; blk < 2; ++blk)       // of block 2p, then 2p+1
        std::memcpy(qs_pairs + p * 64 + half * 32 + blk * 16, qs + (2 * p + blk) * kQuantBlock + half * 16, 16);
}

void matvec_scalar(QuantType q, const uint8_t* w, size_t cols, const float* x,
                   const QuantizedActivations& xa, float* y, size_t row_begin, size_t row_end) {
  const size_t nb = n_blocks(cols);
  const float* xd = xa.d;
  const int8_t* xqs = xa.qs;
  const size_t row_bytes = quant_matrix_bytes(q, 1, cols);
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float acc = 0;
    switch (q) {
      case QuantType::kF32: {
        const auto* f = reinterpret_cast<const float*>(row);
        for (size_t c = 0; c < cols; ++c) acc += f[c] * x[c];
        break;
      }
      case QuantType::kBF16:
        for (size_t c = 0; c < cols; ++c) acc += bf16_to_f32(load_u16(row + 2 * c)) * x[c];
        break;
      case QuantType::kQ8: {
        auto* qs = reinterpret_cast<const int8_t*>(row + nb * 2);
        for (size_t b = 0; b < nb; ++b) {
          int32_t isum = 0;  // exact: |sum| <= 32*127*127
          for (int i = 0; i < kQuantBlock; ++i) isum += qs[b * kQuantBlock + i] * xqs[b * kQuantBlock + i];
          acc += f16_to_f32(load_u16(row + 2 * b)) * xd[b] * static_cast<float>(isum);
        }
        break;
      }
      case QuantType::kQ4: {
        const uint8_t* qs = row + nb * 2;
        for (size_t b = 0; b < nb; ++b) {
          // Unpack first: two simple loops the compiler vectorises (one fused loop it did not).
          int8_t wq[kQuantBlock];
          for (int j = 0; j < kHalfBlock; ++j) {
            uint8_t byte = qs[b * kHalfBlock + j];
            wq[j] = static_cast<int8_t>((byte & 0xf) - 8);
            wq[j + kHalfBlock] = static_cast<int8_t>((byte >> 4) - 8);
          }
          int32_t isum = 0;
          const int8_t* xb = xqs + b * kQuantBlock;
          for (int i = 0; i < kQuantBlock; ++i) isum += wq[i] * xb[i];
          acc += f16_to_f32(load_u16(row + 2 * b)) * xd[b] * static_cast<float>(isum);
        }
        break;
      }
    }
    y[r] = acc;
  }
}

}  // namespace detail

namespace {

// Per-thread scratch of quant_matvec (threads call it concurrently on disjoint row ranges): the
// input rounded to int8 blocks, sized for `cols` columns. Growing only, so a thread that has
// seen the widest input (or reserve_matvec_scratch) never allocates again.
struct MatvecScratch {
  std::vector<float> d, sum;
  std::vector<int8_t> q, pair;
  std::vector<uint8_t> abs;
  void fit(size_t cols) {
    const size_t nb = n_blocks(cols);
    if (d.size() < nb) d.resize(nb);
    if (sum.size() < nb) sum.resize(nb);
    if (q.size() < nb * kQuantBlock) q.resize(nb * kQuantBlock);
    if (abs.size() < nb * kQuantBlock) abs.resize(nb * kQuantBlock);
    if (pair.size() < nb / 2 * 2 * kQuantBlock) pair.resize(nb / 2 * 2 * kQuantBlock);
  }
};

MatvecScratch& matvec_scratch() {
  thread_local MatvecScratch s;
  return s;
}

}  // namespace

void reserve_matvec_scratch(size_t max_cols) { matvec_scratch().fit(max_cols); }

void quant_matvec(QuantType q, const uint8_t* w, size_t cols, const float* x, float* y,
                  size_t row_begin, size_t row_end) {
  if (row_begin >= row_end) return;
  if (const auto g = quant_ggml_type(q)) {
    ggml_matvec(*g, w, cols, x, y, row_begin, row_end);
    return;
  }
  detail::QuantizedActivations xa;
  if (q == QuantType::kQ8 || q == QuantType::kQ4) {
    MatvecScratch& s = matvec_scratch();
    s.fit(cols);
    auto quantize = detail::avx2_usable() ? detail::quantize_activations_avx2 : detail::quantize_activations;
    quantize(x, cols, s.d.data(), s.q.data(), s.abs.data(), s.sum.data(), s.pair.data());
    xa = {s.d.data(), s.q.data(), s.abs.data(), s.sum.data(), s.pair.data()};
  }
  if (detail::avx2_usable()) detail::matvec_avx2(q, w, cols, x, xa, y, row_begin, row_end);
  else detail::matvec_scalar(q, w, cols, x, xa, y, row_begin, row_end);
}

bool quant_simd_available() { return detail::avx2_usable(); }

namespace detail {

bool avx2_usable() {
#if defined(MOESTREAM_AVX2_KERNELS)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

#if !defined(MOESTREAM_AVX2_KERNELS)
void quantize_activations_avx2(const float*, size_t, float*, int8_t*, uint8_t*, float*, int8_t*) {
  MOE_ASSERT(false, "quantize_activations_avx2 called in a build without the AVX2 kernels");
}
void matvec_avx2(QuantType, const uint8_t*, size_t, const float*, const QuantizedActivations&,
                 float*, size_t, size_t) {
  MOE_ASSERT(false, "matvec_avx2 called in a build without the AVX2 kernels");
}
#endif

}  // namespace detail

}  // namespace moestream
