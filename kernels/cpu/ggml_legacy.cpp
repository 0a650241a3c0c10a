// The legacy family of ggml types: the plain types (F32, F16, BF16) and the 32-element block types
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4). Dequantisation (bit-exact to gguf.quants), the
// scalar reference products, the per-thread input scratch and the kernel table, which also holds
// NVFP4 (ggml_nvfp4.cpp), whose products take the same int8 inputs.
//
// Compiled with -ffp-contract=off: gguf.quants rounds d*q and then +m (Q4_1, Q5_1) separately,
// and a fused multiply-add under -march=native would round once and differ in the last bit.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/half.h"
#include "common/load_le.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_legacy_kernels.h"
#include "kernels/cpu/ggml_nvfp4_kernels.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream::detail {
namespace {

constexpr size_t kBlock = 32;
constexpr size_t kHalf = 16;

uint16_t load_u16(const uint8_t* p) { return load_le<uint16_t>(p); }

uint32_t load_u32(const uint8_t* p) { return load_le<uint32_t>(p); }

float f16_at(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// Nibble j of a 16-byte run: elements 0..15 are the low nibbles, 16..31 the high ones.
int nibble(const uint8_t* qs, size_t j) { return j < kHalf ? (qs[j] & 0xf) : (qs[j - kHalf] >> 4); }

// E8M0 exponent e as a float of half its value, 2^(e-128): the MXFP4 element table holds doubled
// E2M1 values so that all of them are integers. e = 0 and 1 are subnormal floats.
float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (uint32_t{0x00200000} << e) : (uint32_t{e} - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// One block type: its size, its scale (and min, kMin) and its 32 integer levels q. The value of
// element j is scale * q[j] (+ min), each step rounded to float as gguf.quants does.
struct Q4_0 {
  static constexpr size_t kBytes = 18;
  static constexpr bool kMin = false;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t*) { return 0; }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    for (size_t j = 0; j < kBlock; ++j) q[j] = static_cast<int8_t>(nibble(b + 2, j) - 8);
  }
};
struct Q4_1 {
  static constexpr size_t kBytes = 20;
  static constexpr bool kMin = true;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t* b) { return f16_at(b + 2); }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    for (size_t j = 0; j < kBlock; ++j) q[j] = static_cast<int8_t>(nibble(b + 4, j));
  }
};
struct Q5_0 {  // d, qh (bit j: bit 4 of element j), 16 bytes of low nibbles
  static constexpr size_t kBytes = 22;
  static constexpr bool kMin = false;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t*) { return 0; }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    const uint32_t qh = load_u32(b + 2);
    for (size_t j = 0; j < kBlock; ++j) q[j] = static_cast<int8_t>((nibble(b + 6, j) | ((qh >> j & 1) << 4)) - 16);
  }
};
struct Q5_1 {
  static constexpr size_t kBytes = 24;
  static constexpr bool kMin = true;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t* b) { return f16_at(b + 2); }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    const uint32_t qh = load_u32(b + 4);
    for (size_t j = 0; j < kBlock; ++j) q[j] = static_cast<int8_t>(nibble(b + 8, j) | ((qh >> j & 1) << 4));
  }
};
struct Q8_0 {
  static constexpr size_t kBytes = 34;
  static constexpr bool kMin = false;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t*) { return 0; }
  static void levels(const uint8_t* b, int8_t q[kBlock]) { std::memcpy(q, b + 2, kBlock); }
};
struct IQ4_NL {
  static constexpr size_t kBytes = 18;
  static constexpr bool kMin = false;
  static float scale(const uint8_t* b) { return f16_at(b); }
  static float min(const uint8_t*) { return 0; }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    for (size_t j = 0; j < kBlock; ++j) q[j] = kIq4nlValues[nibble(b + 2, j)];
  }
};
struct MXFP4 {  // one E8M0 byte, 16 bytes of E2M1 nibbles
  static constexpr size_t kBytes = 17;
  static constexpr bool kMin = false;
  static float scale(const uint8_t* b) { return e8m0_half(b[0]); }
  static float min(const uint8_t*) { return 0; }
  static void levels(const uint8_t* b, int8_t q[kBlock]) {
    for (size_t j = 0; j < kBlock; ++j) q[j] = kMxfp4Values[nibble(b + 1, j)];
  }
};

template <class T>
void dequantize_blocks(const uint8_t* src, size_t n, float* dst) {
  MOE_ASSERT(n % kBlock == 0, "ggml block row of " + std::to_string(n) + " elements");
  int8_t q[kBlock];
  for (size_t b = 0; b < n / kBlock; ++b, src += T::kBytes, dst += kBlock) {
    T::levels(src, q);
    const float d = T::scale(src);
    if constexpr (T::kMin) {
      const float m = T::min(src);
      for (size_t j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j]) + m;
    } else {
      for (size_t j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(q[j]);
    }
  }
}

void dequantize_f32(const uint8_t* src, size_t n, float* dst) { std::memcpy(dst, src, n * 4); }
void dequantize_f16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
}
void dequantize_bf16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
}

// Inputs per pass of the scalar products: each weight block is decoded once per pass.
constexpr size_t kScalarTile = 8;

// The reference product of a block type: per block, the exact int32 dot of the levels with the
// int8 input, times d_w*d_x (float), plus m*d_x*sum(input levels) for the types with a min; summed
// in block order. The AVX2 kernel computes the same terms in another order.
template <class T>
void rounded_rows(const uint8_t* w, const GgmlActivations& a, size_t first, size_t n, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  const size_t row_bytes = a.nb * T::kBytes;
  int8_t q[kBlock];
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (size_t i0 = 0; i0 < n; i0 += kScalarTile) {
      const size_t ni = std::min(kScalarTile, n - i0);
      float acc[kScalarTile] = {};
      for (size_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = row + b * T::kBytes;
        T::levels(blk, q);
        const float dw = T::scale(blk), mw = T::min(blk);
        for (size_t i = 0; i < ni; ++i) {
          const size_t xb = (first + i0 + i) * a.stride + b;
          const int8_t* xq = a.qs + xb * kBlock;
          int32_t isum = 0;  // exact: |sum| <= 32 * 128 * 127
          for (size_t j = 0; j < kBlock; ++j) isum += q[j] * xq[j];
          acc[i] += dw * a.d[xb] * static_cast<float>(isum);
          if constexpr (T::kMin) acc[i] += mw * a.d[xb] * (a.sum8[xb] * 0.125f);
        }
      }
      for (size_t i = 0; i < ni; ++i) y[(i0 + i) * y_stride + r] = acc[i];
    }
  }
}

template <class T>
void matmul_blocks(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride,
                   size_t row_begin, size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  MOE_ASSERT(cols % kBlock == 0, "ggml block matrix of " + std::to_string(cols) + " columns");
  rounded_rows<T>(w, ggml_round_activations(x, cols, n, false), 0, n, y, y_stride, row_begin, row_end);
}

template <class T>
void matvec_blocks(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin, size_t row_end) {
  matmul_blocks<T>(w, cols, x, 1, y, 0, row_begin, row_end);
}

template <class T>
void rounded_matvec(const uint8_t* w, const GgmlActivations& a, size_t input, float* y, size_t row_begin,
                    size_t row_end) {
  rounded_rows<T>(w, a, input, 1, y, 0, row_begin, row_end);
}

// The plain types multiply the float input directly, summed in column order.
template <float (*kLoad)(const uint8_t*, size_t)>
void matmul_plain(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  for (size_t r = row_begin; r < row_end; ++r) {
    for (size_t i0 = 0; i0 < n; i0 += kScalarTile) {
      const size_t ni = std::min(kScalarTile, n - i0);
      float acc[kScalarTile] = {};
      for (size_t c = 0; c < cols; ++c) {
        const float wc = kLoad(w, r * cols + c);
        for (size_t i = 0; i < ni; ++i) acc[i] += wc * x[(i0 + i) * cols + c];
      }
      for (size_t i = 0; i < ni; ++i) y[(i0 + i) * y_stride + r] = acc[i];
    }
  }
}

float load_f32(const uint8_t* w, size_t i) {
  float f;
  std::memcpy(&f, w + 4 * i, 4);
  return f;
}
float load_f16(const uint8_t* w, size_t i) { return f16_at(w + 2 * i); }
float load_bf16(const uint8_t* w, size_t i) { return bf16_to_f32(load_u16(w + 2 * i)); }

template <float (*kLoad)(const uint8_t*, size_t)>
void matvec_plain(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin, size_t row_end) {
  matmul_plain<kLoad>(w, cols, x, 1, y, 0, row_begin, row_end);
}

template <class T>
GgmlKernels block_kernels() {
  GgmlKernels k{dequantize_blocks<T>, matvec_blocks<T>, matmul_blocks<T>, nullptr, nullptr};
  k.rounded_matvec_scalar = rounded_matvec<T>;
  return k;
}

template <float (*kLoad)(const uint8_t*, size_t)>
GgmlKernels plain_kernels(GgmlDequantizeFn dequantize) {
  return {dequantize, matvec_plain<kLoad>, matmul_plain<kLoad>, nullptr, nullptr};
}

struct Table {
  GgmlKernels f32 = plain_kernels<load_f32>(dequantize_f32);
  GgmlKernels f16 = plain_kernels<load_f16>(dequantize_f16);
  GgmlKernels bf16 = plain_kernels<load_bf16>(dequantize_bf16);
  GgmlKernels q4_0 = block_kernels<Q4_0>();
  GgmlKernels q4_1 = block_kernels<Q4_1>();
  GgmlKernels q5_0 = block_kernels<Q5_0>();
  GgmlKernels q5_1 = block_kernels<Q5_1>();
  GgmlKernels q8_0 = block_kernels<Q8_0>();
  GgmlKernels iq4_nl = block_kernels<IQ4_NL>();
  GgmlKernels mxfp4 = block_kernels<MXFP4>();
  GgmlKernels nvfp4 = nvfp4_kernels();  // ggml_nvfp4.cpp: 64-element blocks on these inputs

  GgmlKernels* find(GgmlType t) {
    switch (t) {
      case GgmlType::kF32: return &f32;
      case GgmlType::kF16: return &f16;
      case GgmlType::kBF16: return &bf16;
      case GgmlType::kQ4_0: return &q4_0;
      case GgmlType::kQ4_1: return &q4_1;
      case GgmlType::kQ5_0: return &q5_0;
      case GgmlType::kQ5_1: return &q5_1;
      case GgmlType::kQ8_0: return &q8_0;
      case GgmlType::kIQ4_NL: return &iq4_nl;
      case GgmlType::kMXFP4: return &mxfp4;
      case GgmlType::kNVFP4: return &nvfp4;
      default: return nullptr;
    }
  }

  Table() {
#if defined(MOESTREAM_AVX2_KERNELS)
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
                       GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kMXFP4}) {
      find(t)->matvec_avx2 = ggml_legacy_matvec_avx2(t);
      find(t)->matmul_avx2 = ggml_legacy_matmul_avx2(t);
      find(t)->rounded_matvec_avx2 = ggml_legacy_rounded_matvec_avx2(t);
    }
#endif
  }
};

// Per-thread rounded inputs (threads call the kernels concurrently on disjoint row ranges).
GgmlActivationBuffers& activation_scratch() {
  thread_local GgmlActivationBuffers s;
  return s;
}

}  // namespace

void GgmlActivationBuffers::fit(size_t stride, size_t n) {
  const size_t blocks = stride * n;
  MOE_ASSERT(n == 0 || blocks / n == stride, "ggml activation scratch size overflows");
  if (d.size() < blocks) d.resize(blocks);
  if (sum8.size() < blocks) sum8.resize(blocks);
  if (qs.size() < blocks * kBlock) qs.resize(blocks * kBlock);
  if (abs_qs.size() < blocks * kBlock) abs_qs.resize(blocks * kBlock);
  if (pairs.size() < blocks * kBlock) pairs.resize(blocks * kBlock);
}

size_t ggml_activation_stride(size_t cols) { return (cols / kBlock + 7) / 8 * 8; }

GgmlActivations ggml_round_activations_into(GgmlActivationBuffers& s, const float* x, size_t cols, size_t n,
                                            bool avx2) {
  MOE_ASSERT(cols % kBlock == 0, "ggml block matrix of " + std::to_string(cols) + " columns");
  const size_t nb = cols / kBlock, stride = ggml_activation_stride(cols);
  s.fit(stride, n);
  auto quantize = avx2 ? quantize_activations_avx2 : quantize_activations;
  for (size_t i = 0; i < n; ++i) {
    float* d = s.d.data() + i * stride;
    float* sum8 = s.sum8.data() + i * stride;
    quantize(x + i * cols, cols, d, s.qs.data() + i * stride * kBlock, s.abs_qs.data() + i * stride * kBlock, sum8,
             s.pairs.data() + i * stride * kBlock);
    // Block scales as llama.cpp's q8_0 activations carry them: rounded to float16 (the quants are
    // rounded with the float32 scale first, as there). The dot products then use the same x̂.
    for (size_t b = 0; b < nb; ++b) d[b] = f16_to_f32(f32_to_f16(d[b]));
    std::fill(d + nb, d + stride, 0.0f);
    std::fill(sum8 + nb, sum8 + stride, 0.0f);
  }
  return {nb, stride, s.d.data(), s.qs.data(), s.abs_qs.data(), s.sum8.data(), s.pairs.data()};
}

GgmlActivations ggml_round_activations(const float* x, size_t cols, size_t n, bool avx2) {
  return ggml_round_activations_into(activation_scratch(), x, cols, n, avx2);
}

void ggml_legacy_reserve_scratch(size_t max_cols, size_t max_inputs) {
  activation_scratch().fit(ggml_activation_stride(max_cols), max_inputs);
}

const GgmlKernels* ggml_legacy_kernels(GgmlType t) {
  static Table table;
  return table.find(t);
}

}  // namespace moestream::detail
