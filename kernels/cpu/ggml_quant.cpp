#include "kernels/cpu/ggml_quant.h"

#include <string>

#include "common/error.h"
#include "kernels/cpu/ggml_kernels.h"
#include "kernels/cpu/quant_kernels.h"

namespace moestream {
namespace {

const detail::GgmlKernels& kernels_of(GgmlType t) {
  const detail::GgmlKernels* k = detail::ggml_legacy_kernels(t);
  if (k == nullptr) k = detail::ggml_kquant_kernels(t);
  if (k == nullptr) {
    throw ConfigError("ggml type " + std::string(ggml_type_name(t)) + " is not supported by this build");
  }
  return *k;
}

}  // namespace

bool ggml_type_computable(GgmlType t) {
  return detail::ggml_legacy_kernels(t) != nullptr || detail::ggml_kquant_kernels(t) != nullptr;
}

void require_ggml_computable(GgmlType t, const std::string& file, const std::string& tensor) {
  if (!ggml_type_computable(t))
    throw ConfigError(file + ": tensor '" + tensor + "' has type " + std::string(ggml_type_name(t)) +
                      ", which this build cannot compute");
}

void ggml_dequantize_row(GgmlType t, const uint8_t* src, size_t n, float* dst) {
  kernels_of(t).dequantize(src, n, dst);
}

void ggml_matvec(GgmlType t, const uint8_t* w, size_t cols, const float* x, float* y,
                 size_t row_begin, size_t row_end) {
  const auto& k = kernels_of(t);
  const auto fn = (k.matvec_avx2 != nullptr && detail::avx2_usable()) ? k.matvec_avx2 : k.matvec_scalar;
  fn(w, cols, x, y, row_begin, row_end);
}

void ggml_matmul(GgmlType t, const uint8_t* w, size_t cols, const float* x, size_t n, float* y,
                 size_t y_stride, size_t row_begin, size_t row_end) {
  const auto& k = kernels_of(t);
  const auto fn = (k.matmul_avx2 != nullptr && detail::avx2_usable()) ? k.matmul_avx2 : k.matmul_scalar;
  fn(w, cols, x, n, y, y_stride, row_begin, row_end);
}

void ggml_reserve_scratch(size_t max_cols, size_t max_inputs) {
  detail::ggml_legacy_reserve_scratch(max_cols, max_inputs);
  detail::ggml_kquant_reserve_scratch(max_cols, max_inputs);
}

}  // namespace moestream
