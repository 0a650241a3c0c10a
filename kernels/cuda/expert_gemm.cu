// The grouped expert GEMM op: checks shapes and dispatches on the layer's quant type to the
// per-encoding launchers (expert_gemm_{q8,q4,bf16}.cu over the tile loop of expert_gemm.cuh).
#include <string>

#include "kernels/cuda/expert_gemm.cuh"
#include "kernels/cuda/gpu_ops.h"

namespace moestream::gpu {

void expert_gemm(QuantType q, const uint8_t* const* w, size_t matrix_offset, const int* row_start,
                 int n_groups, int max_rows_per_group, int rows, int cols, const float* x, float* y,
                 Stream s) {
  const std::string shape = "n_groups=" + std::to_string(n_groups) +
                            " max_rows_per_group=" + std::to_string(max_rows_per_group) +
                            " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
  if (n_groups <= 0 || n_groups > 65535 || max_rows_per_group <= 0 || rows <= 0 || cols <= 0)
    throw Error("gpu::expert_gemm: bad shape " + shape);
  if (!w || !row_start || !x || !y) throw Error("gpu::expert_gemm: null device pointer");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 4 != 0)
    throw Error("gpu::expert_gemm: x must be 16-byte aligned and y 4-byte aligned");
  if (matrix_offset % 16 != 0)
    throw Error("gpu::expert_gemm: matrix_offset " + std::to_string(matrix_offset) +
                " is not 16-byte aligned (loader/format/expert_file.h aligns matrices to 64)");
  const GemmArgs a{w, matrix_offset, row_start, rows, cols, x, y};
  switch (q) {
    case QuantType::kQ8:
    case QuantType::kQ4:
      // Whole 32-wide blocks per row keep every lane's 16-byte activation load inside the row.
      if (cols % kQuantBlock != 0)
        throw ConfigError("gpu::expert_gemm: " + std::string(quant_name(q)) +
                          " needs cols to be a multiple of " + std::to_string(kQuantBlock) + " (" +
                          shape + "); use expert_matvec for other widths");
      if (q == QuantType::kQ8) return expert_gemm_q8_cuda(a, n_groups, max_rows_per_group, s);
      return expert_gemm_q4_cuda(a, n_groups, max_rows_per_group, s);
    case QuantType::kBF16: return expert_gemm_bf16_cuda(a, n_groups, max_rows_per_group, s);
    case QuantType::kF32: break;
  }
  throw ConfigError("gpu::expert_gemm: quant type '" + std::string(quant_name(q)) +
                    "' has no GPU kernel (q8, q4 and bf16 do)");
}

}  // namespace moestream::gpu
