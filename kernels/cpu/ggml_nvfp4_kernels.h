// Internal to kernels/cpu: the CPU kernels of NVFP4 (layout and scale tables:
// loader/format/ggml_nvfp4.h): ggml_nvfp4.cpp (scalar reference), ggml_nvfp4_avx2.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loader/format/ggml_nvfp4.h"

namespace moestream::detail {

struct GgmlActivations;  // ggml_legacy_kernels.h
struct GgmlKernels;      // ggml_kernels.h

// The kernels of NVFP4 (ggml_nvfp4.cpp), an entry of the legacy family's table: its products take
// the family's int8 inputs per 32 columns (two per block), so rounded inputs serve it too.
GgmlKernels nvfp4_kernels();

// The AVX2 products (ggml_nvfp4_avx2.cpp), same integer sums per sub-block as the scalar ones.
void nvfp4_rounded_rows_avx2(const uint8_t* w, const GgmlActivations& a, size_t first, size_t n, float* y,
                             size_t y_stride, size_t row_begin, size_t row_end);

}  // namespace moestream::detail
