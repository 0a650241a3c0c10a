// moestream.RoutingLog: a routing log (infer --collect-routing) as numpy columns, one row per
// (request, position, layer) record; each column is filled once and handed to numpy without a copy.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <string>
#include <vector>

#include "loader/format/routing_log.h"
#include "python/src/bindings.h"

namespace moestream::py_bindings {
namespace {

struct PyRoutingLog {
  RoutingLogHeader header;
  std::string path, warning;
  uint64_t valid_bytes = 0, truncated_bytes = 0;
  py::object layer, position, ids, weights, request, phase, router_input;
  size_t n_records = 0;
};

PyRoutingLog load(const std::filesystem::path& path) {
  PyRoutingLog out;
  out.path = path.string();
  std::vector<uint16_t> layer, ids;
  std::vector<uint32_t> position;
  std::vector<float> weights, inputs;
  std::vector<uint64_t> request;
  std::vector<uint8_t> phase;
  bool all_inputs = true;
  size_t k = 0, hidden = 0;
  {
    py::gil_scoped_release nogil;
    RoutingLog log = read_routing_log(path);
    out.header = log.header;
    out.warning = log.warning;
    out.valid_bytes = log.valid_bytes;
    out.truncated_bytes = log.truncated_bytes;
    const size_t n = log.records.size();
    k = log.header.top_k;
    hidden = log.header.hidden;
    out.n_records = n;
    layer.reserve(n);
    position.reserve(n);
    request.reserve(n);
    phase.reserve(n);
    ids.reserve(n * k);
    weights.reserve(n * k);
    for (const RoutingRecord& r : log.records) all_inputs = all_inputs && r.router_input.size() == hidden;
    all_inputs = all_inputs && n > 0;
    if (all_inputs) inputs.reserve(n * hidden);
    for (RoutingRecord& r : log.records) {
      layer.push_back(r.layer);
      position.push_back(r.position);
      request.push_back(r.request_id);
      phase.push_back(uint8_t(r.phase));
      ids.insert(ids.end(), r.ids.begin(), r.ids.end());
      weights.insert(weights.end(), r.weights.begin(), r.weights.end());
      if (all_inputs) inputs.insert(inputs.end(), r.router_input.begin(), r.router_input.end());
      r = RoutingRecord{};  // frees each record once copied: peak memory ~ one copy of the log
    }
  }
  const auto n = py::ssize_t(out.n_records);
  out.layer = to_numpy(std::move(layer), {n});
  out.position = to_numpy(std::move(position), {n});
  out.request = to_numpy(std::move(request), {n});
  out.phase = to_numpy(std::move(phase), {n});
  out.ids = to_numpy(std::move(ids), {n, py::ssize_t(k)});
  out.weights = to_numpy(std::move(weights), {n, py::ssize_t(k)});
  out.router_input = all_inputs ? py::object(to_numpy(std::move(inputs), {n, py::ssize_t(hidden)})) : py::none();
  return out;
}

}  // namespace

void bind_routing(py::module_& m) {
  py::class_<PyRoutingLog>(m, "RoutingLog",
                           "A routing log read whole and validated (loader/format/routing_log.h); columns are "
                           "numpy arrays with one row per (request, position, layer) record.")
      .def(py::init(&load), py::arg("path"))
      .def_readonly("path", &PyRoutingLog::path)
      .def_readonly("layer", &PyRoutingLog::layer)
      .def_readonly("position", &PyRoutingLog::position)
      .def_readonly("ids", &PyRoutingLog::ids)
      .def_readonly("weights", &PyRoutingLog::weights)
      .def_readonly("request", &PyRoutingLog::request)
      .def_readonly("phase", &PyRoutingLog::phase)
      .def_readonly("router_input", &PyRoutingLog::router_input)
      .def_readonly("warning", &PyRoutingLog::warning)
      .def_readonly("valid_bytes", &PyRoutingLog::valid_bytes)
      .def_readonly("truncated_bytes", &PyRoutingLog::truncated_bytes)
      .def_property_readonly("model_hash", [](const PyRoutingLog& l) { return l.header.model_hash; })
      .def_property_readonly("n_layers", [](const PyRoutingLog& l) { return l.header.n_layers; })
      .def_property_readonly("n_experts", [](const PyRoutingLog& l) { return l.header.n_experts; })
      .def_property_readonly("top_k", [](const PyRoutingLog& l) { return l.header.top_k; })
      .def_property_readonly("hidden", [](const PyRoutingLog& l) { return l.header.hidden; })
      .def("__len__", [](const PyRoutingLog& l) { return l.n_records; });
  m.attr("PHASE_PREFILL") = int(RoutingPhase::kPrefill);
  m.attr("PHASE_DECODE") = int(RoutingPhase::kDecode);
}

}  // namespace moestream::py_bindings
