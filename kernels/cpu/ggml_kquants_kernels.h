// Internal to kernels/cpu/ggml_kquants*.cpp, ggml_iquants.cpp and their tests: the int8 activation
// format the products of the 256-element super-block types consume (K-quants, IQ4_XS, the
// IQ1/IQ2/IQ3 lattice types and the ternary TQ types), their decoded block, and the row kernels
// behind the GgmlKernels entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loader/format/ggml_types.h"

namespace moestream::detail {

constexpr size_t kSuperBlock = 256;  // elements of a K-quant super-block
constexpr size_t kSubBlock16 = 16;   // the granularity of the activation sums

// A super-block decoded: 256 small signed integers q, an integer scale per 16 columns, a minimum
// per 16 columns (0 for types without one) and two float32 factors. The value of column e is
// (d * scale[e / 16]) * q[e] - dmin * min[e / 16], each step rounded to float32.
struct KBlock {
  int8_t q[kSuperBlock];
  int32_t scale[16];
  int32_t min[16];
  float d = 0, dmin = 0;
};
using KDecodeFn = void (*)(const uint8_t* block, KBlock& out);

// The decoders of the types whose levels come from a lattice or a base-3/base-4 code
// (ggml_iquants.cpp). Their factor d is the stored f16 times a power of two, their scales odd
// (2s + 1) and their minimums 0, so every value is an exact float32 product (see there).
void decode_iq2_xxs(const uint8_t* b, KBlock& o);
void decode_iq2_xs(const uint8_t* b, KBlock& o);
void decode_iq2_s(const uint8_t* b, KBlock& o);
void decode_iq3_xxs(const uint8_t* b, KBlock& o);
void decode_iq3_s(const uint8_t* b, KBlock& o);
void decode_iq1_s(const uint8_t* b, KBlock& o);
void decode_iq1_m(const uint8_t* b, KBlock& o);
void decode_tq1_0(const uint8_t* b, KBlock& o);
void decode_tq2_0(const uint8_t* b, KBlock& o);

// n inputs of cols columns each rounded to int8 per super-block of 256: d = amax / 127 (float32),
// q = nearbyint(x * (127 / amax)) clamped to [-127, 127] (|q| <= 127 keeps every maddubs pair sum
// below 2^15), and bsums = the sums of q over each 16 columns (what the K-quant minimum and offset
// terms multiply). Input i, super-block b: d[i*nb + b], qs + (i*nb + b)*256, bsums + (i*nb + b)*16.
struct KActivations {
  const float* d = nullptr;
  const int8_t* qs = nullptr;
  const int16_t* bsums = nullptr;
  size_t nb = 0;  // super-blocks per input
};

// The arrays behind a KActivations (growing only).
struct KActivationBuffers {
  std::vector<float> d;
  std::vector<int8_t> qs;
  std::vector<int16_t> bsums;
  void fit(size_t cols, size_t n);  // room for n inputs of cols (a multiple of 256) columns
};

// Rounds n inputs of cols columns (a multiple of 256) into b, growing it only if too small.
KActivations kquant_round_into(KActivationBuffers& b, const float* x, size_t cols, size_t n, bool avx2);

// Rounds one input (cols a multiple of 256) into d[cols/256], qs[cols], bsums[cols/16].
void kquant_round_activations(const float* x, size_t cols, float* d, int8_t* qs, int16_t* bsums);
// The same, bit for bit, with AVX2; used when avx2_usable().
void kquant_round_activations_avx2(const float* x, size_t cols, float* d, int8_t* qs, int16_t* bsums);

// y[i * y_stride + r] = W[r] . x[i] for the n rounded inputs and r in [row_begin, row_end).
// Per super-block the integer sums are exact; then acc += (dx*d)*isum - (dx*dmin)*msum in float.
// The result for one input does not depend on n (matmul equals matvec input by input).
void kquant_rows_scalar(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n,
                        float* y, size_t y_stride, size_t row_begin, size_t row_end);
void kquant_rows_avx2(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n,
                      float* y, size_t y_stride, size_t row_begin, size_t row_end);
// The lattice and ternary types' part of kquant_rows_avx2 (ggml_iquants_avx2.cpp).
void iquant_rows_avx2(GgmlType t, const uint8_t* w, size_t cols, const KActivations& xa, size_t n,
                      float* y, size_t y_stride, size_t row_begin, size_t row_end);

// The scalar dequantisation of one K-quant type (n a multiple of 256).
void kquant_dequantize(GgmlType t, const uint8_t* src, size_t n, float* dst);

}  // namespace moestream::detail
