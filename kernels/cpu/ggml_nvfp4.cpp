// NVFP4 on the CPU (layout: loader/format/ggml_nvfp4.h, docs/format.md): the bit-exact
// dequantisation and the scalar reference products, plus the table entry that picks the AVX2 ones
// (ggml_nvfp4_avx2.cpp).
// Products take the legacy family's inputs (int8 per 32 columns, float16-rounded scales): a block
// meets two input blocks, each sub-block of 16 half of one.
#include "kernels/cpu/ggml_nvfp4_kernels.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/ggml_legacy_kernels.h"

namespace moestream::detail {
namespace {

constexpr size_t kSub = 16;        // elements per scale
constexpr size_t kInputBlock = 32;  // elements per int8 input block

// The 64 signed levels (doubled E2M1) of a block.
void levels(const uint8_t* b, int8_t q[kNvfp4Block]) {
  for (size_t s = 0; s < 4; ++s)
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t v = b[4 + 8 * s + j];
      q[kSub * s + j] = kE2m1Doubled[v & 0xf];
      q[kSub * s + 8 + j] = kE2m1Doubled[v >> 4];
    }
}

void dequantize(const uint8_t* src, size_t n, float* dst) {
  MOE_ASSERT(n % kNvfp4Block == 0, "NVFP4 row of " + std::to_string(n) + " elements");
  int8_t q[kNvfp4Block];
  for (size_t b = 0; b < n / kNvfp4Block; ++b, src += kNvfp4Bytes, dst += kNvfp4Block) {
    levels(src, q);
    for (size_t j = 0; j < kNvfp4Block; ++j) dst[j] = kNvfp4HalfScales.v[src[j / kSub]] * static_cast<float>(q[j]);
  }
}

constexpr size_t kScalarTile = 8;  // inputs per pass: each weight block decoded once per pass

// The reference: per sub-block the exact int32 dot of its 16 levels with the int8 input, times
// (scale/2 * d_x) in float, summed in sub-block order.
void rounded_rows(const uint8_t* w, const GgmlActivations& a, size_t first, size_t n, float* y, size_t y_stride,
                  size_t row_begin, size_t row_end) {
  const size_t blocks = a.nb / 2, row_bytes = blocks * kNvfp4Bytes;
  int8_t q[kNvfp4Block];
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (size_t i0 = 0; i0 < n; i0 += kScalarTile) {
      const size_t ni = std::min(kScalarTile, n - i0);
      float acc[kScalarTile] = {};
      for (size_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = row + b * kNvfp4Bytes;
        levels(blk, q);
        for (size_t s = 0; s < 4; ++s) {
          const float dw = kNvfp4HalfScales.v[blk[s]];
          for (size_t i = 0; i < ni; ++i) {
            const size_t xb = (first + i0 + i) * a.stride + 2 * b + s / 2;
            const int8_t* xq = a.qs + xb * kInputBlock + (s % 2) * kSub;
            int32_t isum = 0;  // exact: |sum| <= 16 * 12 * 127
            for (size_t j = 0; j < kSub; ++j) isum += q[kSub * s + j] * xq[j];
            acc[i] += dw * a.d[xb] * static_cast<float>(isum);
          }
        }
      }
      for (size_t i = 0; i < ni; ++i) y[(i0 + i) * y_stride + r] = acc[i];
    }
  }
}

template <bool kAvx2>
void matmul(const uint8_t* w, size_t cols, const float* x, size_t n, float* y, size_t y_stride, size_t row_begin,
            size_t row_end) {
  if (row_begin >= row_end || n == 0) return;
  MOE_ASSERT(cols % kNvfp4Block == 0, "NVFP4 matrix of " + std::to_string(cols) + " columns");
  const GgmlActivations a = ggml_round_activations(x, cols, n, kAvx2);
  if constexpr (kAvx2)
    nvfp4_rounded_rows_avx2(w, a, 0, n, y, y_stride, row_begin, row_end);
  else
    rounded_rows(w, a, 0, n, y, y_stride, row_begin, row_end);
}

template <bool kAvx2>
void matvec(const uint8_t* w, size_t cols, const float* x, float* y, size_t row_begin, size_t row_end) {
  matmul<kAvx2>(w, cols, x, 1, y, 0, row_begin, row_end);
}

template <bool kAvx2>
void rounded_matvec(const uint8_t* w, const GgmlActivations& a, size_t input, float* y, size_t row_begin,
                    size_t row_end) {
  MOE_ASSERT(a.nb % 2 == 0, "NVFP4 input of " + std::to_string(a.nb) + " 32-column blocks");
  if constexpr (kAvx2)
    nvfp4_rounded_rows_avx2(w, a, input, 1, y, 0, row_begin, row_end);
  else
    rounded_rows(w, a, input, 1, y, 0, row_begin, row_end);
}

}  // namespace

GgmlKernels nvfp4_kernels() {
  GgmlKernels k{dequantize, matvec<false>, matmul<false>, nullptr, nullptr};
  k.rounded_matvec_scalar = rounded_matvec<false>;
#if defined(MOESTREAM_AVX2_KERNELS)
  k.matvec_avx2 = matvec<true>;
  k.matmul_avx2 = matmul<true>;
  k.rounded_matvec_avx2 = rounded_matvec<true>;
#endif
  return k;
}

}  // namespace moestream::detail
