// The ggml block-type kernels (kernels/cpu/ggml_quant.h) for tests that check them against the
// `gguf` package's reference: private names, raw bytes in, float32 numpy arrays out.
#include <string>

#include "common/error.h"
#include "kernels/cpu/ggml_quant.h"
#include "python/src/bindings.h"

namespace moestream::py_bindings {
namespace {

GgmlType type_named(const std::string& name) {
  const auto info = ggml_type_info_by_name(name);
  if (!info) throw ConfigError("unknown ggml type '" + name + "'");
  return info->type;
}

// Bytes of a rows x cols matrix of type t, checked against what the caller passed.
size_t checked_matrix_bytes(GgmlType t, size_t rows, size_t cols, size_t given) {
  const auto row = ggml_row_bytes(t, cols);
  if (!row || (rows != 0 && *row > SIZE_MAX / rows) || *row * rows != given) {
    throw ConfigError("matrix of " + std::to_string(rows) + " x " + std::to_string(cols) + " " +
                      std::string(ggml_type_name(t)) + " does not match " + std::to_string(given) + " bytes");
  }
  return *row;
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("_ggml_dequantize", [](const std::string& type, const py::bytes& data, size_t n) {
    const GgmlType t = type_named(type);
    const std::string bytes = data;
    checked_matrix_bytes(t, 1, n, bytes.size());
    std::vector<float> out(n);
    ggml_dequantize_row(t, reinterpret_cast<const uint8_t*>(bytes.data()), n, out.data());
    return to_numpy(std::move(out), {py::ssize_t(n)});
  });
  m.def("_ggml_matmul", [](const std::string& type, const py::bytes& w, size_t rows, size_t cols,
                           py::array_t<float, py::array::c_style | py::array::forcecast> x) {
    const GgmlType t = type_named(type);
    const std::string bytes = w;
    checked_matrix_bytes(t, rows, cols, bytes.size());
    if (x.ndim() != 2 || size_t(x.shape(1)) != cols) throw ConfigError("x must be n x cols");
    const size_t n = x.shape(0);
    std::vector<float> y(n * rows);
    const auto* wp = reinterpret_cast<const uint8_t*>(bytes.data());
    if (n == 1) {
      ggml_matvec(t, wp, cols, x.data(), y.data(), 0, rows);
    } else {
      ggml_matmul(t, wp, cols, x.data(), n, y.data(), rows, 0, rows);
    }
    return to_numpy(std::move(y), {py::ssize_t(n), py::ssize_t(rows)});
  });
}

}  // namespace moestream::py_bindings
