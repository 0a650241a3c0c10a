// DeepSeek-V3's FP8 checkpoints: float8_e4m3fn weight matrices, each with a float scale per block
// of rows x cols elements (128 x 128 in every official release) in the tensor `<name>_scale_inv`;
// the weight is fp8 value times that scale. Dequantised in memory, a matrix at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moestream {

struct Fp8BlockSize {
  int rows = 128, cols = 128;  // quantization_config.weight_block_size of config.json
};

// float8_e4m3fn (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities; S.1111.111
// is NaN) widened exactly to float.
float fp8_e4m3_to_f32(uint8_t b);

// Rows [row0, row0 + n_rows) of an FP8 matrix with `cols` columns (w points at its row 0), each
// element times its block's scale from `scale` ([ceil(rows/b.rows), scale_cols] floats, row-major,
// scale_cols = ceil(cols/b.cols)), into dst [n_rows, cols].
void dequantize_fp8_rows(const uint8_t* w, size_t cols, const float* scale, size_t scale_cols, Fp8BlockSize b,
                         size_t row0, size_t n_rows, float* dst);

}  // namespace moestream
