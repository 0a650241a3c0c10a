// Implementation of runtime/convert/fp8_weights.h.
#include "runtime/convert/fp8_weights.h"

#include <cmath>
#include <limits>

#include "common/error.h"

namespace moestream {

float fp8_e4m3_to_f32(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) v = std::numeric_limits<float>::quiet_NaN();
  else if (exp == 0) v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^(1-7)
  else v = std::ldexp(float(8 + man), exp - 10);      // (1 + man/8) * 2^(exp-7)
  return sign ? -v : v;
}

void dequantize_fp8_rows(const uint8_t* w, size_t cols, const float* scale, size_t scale_cols, Fp8BlockSize b,
                         size_t row0, size_t n_rows, float* dst) {
  MOE_ASSERT(b.rows > 0 && b.cols > 0 && scale_cols == (cols + size_t(b.cols) - 1) / size_t(b.cols));
  float table[256];  // every code once: the loop below is a lookup and a multiply
  for (int i = 0; i < 256; ++i) table[i] = fp8_e4m3_to_f32(uint8_t(i));
  for (size_t r = 0; r < n_rows; ++r) {
    const size_t row = row0 + r;
    const uint8_t* src = w + row * cols;
    const float* s = scale + (row / size_t(b.rows)) * scale_cols;
    float* out = dst + r * cols;
    for (size_t c = 0; c < cols; ++c) out[c] = table[src[c]] * s[c / size_t(b.cols)];
  }
}

}  // namespace moestream
