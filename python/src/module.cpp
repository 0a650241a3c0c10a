// Entry point of the pybind11 extension `moestream._moestream`: registers the exception classes
// (moestream C++ errors keep their kind and message, options named as keywords) and the wrapped areas of the API.
#include "python/src/bindings.h"

#include "common/error.h"
#include "runtime/engine/options.h"

namespace py = pybind11;
using namespace moestream;

namespace {
// A message's option marks (common/option_ref.h) as Python keywords.
std::string python_text(const Error& e) { return render_options(e.what(), OptionCaller::kPython); }
}  // namespace

PYBIND11_MODULE(_moestream, m) {
  m.doc() = "moestream: Mixture-of-Experts inference with experts streamed from SSD";
  // Base class first so that `except moestream.Error` catches every kind; each kind also derives
  // from the matching Python built-in (OSError / ValueError) so generic handlers work too.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::object io_error = py::reinterpret_steal<py::object>(PyErr_NewException(
      "moestream.IoError", py::make_tuple(error, py::handle(PyExc_OSError)).release().ptr(), nullptr));
  static py::object format_error = py::reinterpret_steal<py::object>(PyErr_NewException(
      "moestream.FormatError", py::make_tuple(error, py::handle(PyExc_ValueError)).release().ptr(), nullptr));
  static py::object config_error = py::reinterpret_steal<py::object>(PyErr_NewException(
      "moestream.ConfigError", py::make_tuple(error, py::handle(PyExc_ValueError)).release().ptr(), nullptr));
  m.attr("IoError") = io_error;
  m.attr("FormatError") = format_error;
  m.attr("ConfigError") = config_error;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      PyErr_SetString(io_error.ptr(), python_text(e).c_str());
    } catch (const FormatError& e) {
      PyErr_SetString(format_error.ptr(), python_text(e).c_str());
    } catch (const ConfigError& e) {
      PyErr_SetString(config_error.ptr(), python_text(e).c_str());
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), python_text(e).c_str());
    }
  });
  py_bindings::bind_model(m);
  py_bindings::bind_routing(m);
  py_bindings::bind_cluster(m);
  py_bindings::bind_kernels(m);
  py_bindings::bind_gguf(m);
}
