// Shared declarations of the pybind11 module `_moestream`: one bind_* function per wrapped area
// of the public C++ API, and the helpers they share (numpy arrays that own a std::vector).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <vector>

namespace moestream::py_bindings {

namespace py = pybind11;

void bind_model(py::module_& m);     // Model, Tokenizer, generation, perplexity, stats
void bind_routing(py::module_& m);   // RoutingLog
void bind_cluster(py::module_& m);   // cluster(), cost model
void bind_kernels(py::module_& m);   // ggml block-type kernels, for tests
void bind_gguf(py::module_& m);      // GGUF reader, for tests

// A numpy array over `v`'s buffer without a copy: the vector moves into a capsule the array owns.
template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), free_when_done);
}

// nlohmann::json -> Python dict/list/number through the json module (stats are small).
inline py::object json_to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

}  // namespace moestream::py_bindings
