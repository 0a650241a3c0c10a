// moestream.cluster() and the I/O cost model, mirroring the `cluster_experts` tool: orders each
// layer's experts from routing logs, reports modelled costs, optionally writes maps or repacks.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster_inputs.h"
#include "cluster/cluster_plan.h"
#include "cluster/coactivation.h"
#include "cluster/io_cost_model.h"
#include "cluster/ordering.h"
#include "cluster/repack.h"
#include "common/checked.h"
#include "common/error.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/format/routing_log.h"
#include "loader/store/store_options.h"
#include "python/src/bindings.h"

namespace fs = std::filesystem;

namespace moestream::py_bindings {
namespace {

using namespace moestream::cluster;

// The engine's read options from the same keywords and defaults as Model's (a 0 KiB gap turns
// coalescing off), through the store options' one builder.
IoEngineOptions engine_read_options(uint64_t coalesce_gap_kb, uint64_t max_read_kb, uint64_t direct_max_read_kb,
                                    bool io_direct, const std::optional<fs::path>& io_profile) {
  const StoreConfig reads{.io_direct = io_direct, .coalesce_gap_kb = coalesce_gap_kb, .max_read_kb = max_read_kb,
                          .direct_max_read_kb = direct_max_read_kb,
                          .io_profile = io_profile ? io_profile->string() : std::string()};
  return build_store_options(reads).io;
}

std::vector<std::string> paths_of(const py::object& routing) {
  if (py::isinstance<py::str>(routing) || py::isinstance(routing, py::module_::import("os").attr("PathLike")))
    return {py::str(routing).cast<std::string>()};
  std::vector<std::string> out;
  for (py::handle h : routing) out.push_back(py::str(h).cast<std::string>());
  return out;
}

py::object run_cluster_py(const fs::path& model, const py::object& routing, const std::string& method_name,
                          const std::optional<py::object>& evaluate, const std::optional<fs::path>& maps_out,
                          bool repack, const std::optional<fs::path>& out, bool shape_only,
                          const std::optional<fs::path>& io_profile, double op_latency_us, double bandwidth_gbps,
                          double neighbour_weight, uint64_t search_moves, uint64_t coalesce_gap_kb,
                          uint64_t max_read_kb, uint64_t direct_max_read_kb, bool io_direct) {
  // cluster_experts' bounds, in Python's spelling (the read options: build_store_options).
  check_range("op_latency_us", op_latency_us, 0.0, 1e9);
  check_range("bandwidth_gbps", bandwidth_gbps, 0.0, 1e6);
  check_range("neighbour_weight", neighbour_weight, 0.0, 1e6);
  const std::vector<std::string> train_paths = paths_of(routing);
  const std::vector<std::string> eval_paths = evaluate ? paths_of(*evaluate) : std::vector<std::string>{};
  ClusterResult r;
  {
    py::gil_scoped_release nogil;
    ClusterRequest req;
    req.method = method_name;
    req.profile = io_profile_of(io_profile.value_or(fs::path()), op_latency_us, bandwidth_gbps);
    req.coactivation.neighbour_weight = neighbour_weight;
    req.search_moves = search_moves;
    req.maps_out = maps_out.value_or(fs::path());
    req.repack = repack;
    req.gguf_out = out.value_or(fs::path());
    const ClusterModel m =
        ClusterModel::read(model, engine_read_options(coalesce_gap_kb, max_read_kb, direct_max_read_kb, io_direct, io_profile));
    check_cluster_request(m, req);
    const std::vector<RoutingLog> train = m.load_logs(train_paths, shape_only);
    const std::vector<RoutingLog> heldout =
        eval_paths.empty() ? std::vector<RoutingLog>{} : m.load_logs(eval_paths, shape_only);
    r = run_cluster(m, train, heldout, req);
  }
  const auto& chosen = r.slots[2];
  const size_t n_layers = chosen.size(), n_experts = n_layers ? chosen[0].size() : 0;
  std::vector<uint32_t> flat;
  for (const auto& layer : chosen) flat.insert(flat.end(), layer.begin(), layer.end());
  py::dict res = json_to_python(r.report);
  res["slots"] = to_numpy(std::move(flat), {py::ssize_t(n_layers), py::ssize_t(n_experts)});
  return res;
}

// Modelled cost of the logs under `slots` (logical -> physical per layer; the model's current
// maps when None).
py::object run_cost(const fs::path& model, const py::object& routing, const std::optional<py::array_t<uint32_t>>& slots,
                    bool shape_only, const std::optional<fs::path>& io_profile, double op_latency_us,
                    double bandwidth_gbps, uint64_t coalesce_gap_kb, uint64_t max_read_kb,
                    uint64_t direct_max_read_kb, bool io_direct) {
  check_range("op_latency_us", op_latency_us, 0.0, 1e9);
  check_range("bandwidth_gbps", bandwidth_gbps, 0.0, 1e6);
  const std::vector<std::string> paths = paths_of(routing);
  std::vector<std::vector<uint32_t>> slot_of;
  if (slots) {
    auto s = slots->unchecked<2>();
    for (py::ssize_t l = 0; l < s.shape(0); ++l) {
      std::vector<uint32_t> row(size_t(s.shape(1)));
      for (py::ssize_t e = 0; e < s.shape(1); ++e) row[size_t(e)] = s(l, e);
      slot_of.push_back(std::move(row));
    }
  }
  nlohmann::json js;
  {
    py::gil_scoped_release nogil;
    const PackedLayout lay =
        read_packed_layout(model, engine_read_options(coalesce_gap_kb, max_read_kb, direct_max_read_kb, io_direct, io_profile));
    if (!slots) {
      for (const ExpertMap& m : lay.maps) {
        std::vector<uint32_t> row(m.size());
        for (uint32_t e = 0; e < m.size(); ++e) row[e] = m.physical(e);
        slot_of.push_back(std::move(row));
      }
    }
    if (slot_of.size() != lay.want.n_layers)
      throw ConfigError("slots: " + std::to_string(slot_of.size()) + " layers, the model has " + std::to_string(lay.want.n_layers));
    for (size_t l = 0; l < slot_of.size(); ++l)
      ExpertMap::from_slots(slot_of[l], "slots row " + std::to_string(l));  // must be a permutation of the experts
    for (const auto& row : slot_of)
      if (row.size() != lay.want.n_experts)
        throw ConfigError("slots: rows of " + std::to_string(row.size()) + " slots, the model has " +
                          std::to_string(lay.want.n_experts) + " experts per layer");
    const IoProfile prof = io_profile_of(io_profile.value_or(fs::path()), op_latency_us, bandwidth_gbps);
    js = cost_json(
        model_cost(coactivation(load_routing_logs(paths, lay.want, model, shape_only)), slot_of, lay.geometry, prof));
  }
  return json_to_python(js);
}

}  // namespace

void bind_cluster(py::module_& m) {
  m.def("cluster", &run_cluster_py, py::arg("model"), py::arg("routing"), py::kw_only(),
        py::arg("method") = "seriation", py::arg("evaluate") = py::none(), py::arg("maps_out") = py::none(),
        py::arg("repack") = false, py::arg("out") = py::none(), py::arg("shape_only") = false, py::arg("io_profile") = py::none(), py::arg("op_latency_us") = 0.0,
        py::arg("bandwidth_gbps") = 0.0, py::arg("neighbour_weight") = 0.0,
        py::arg("search_moves") = kDefaultSearchMoves, py::arg("coalesce_gap_kb") = 64, py::arg("max_read_kb") = 1024,
        py::arg("direct_max_read_kb") = 4096, py::arg("io_direct") = false,
        "Orders each layer's experts from routing logs (cluster_experts); returns costs and slots. "
        "A packed model: maps_out and repack (in place). A GGUF: out writes a permuted copy.");
  m.def("cost", &run_cost, py::arg("model"), py::arg("routing"), py::kw_only(), py::arg("slots") = py::none(),
        py::arg("shape_only") = false, py::arg("io_profile") = py::none(), py::arg("op_latency_us") = 0.0,
        py::arg("bandwidth_gbps") = 0.0, py::arg("coalesce_gap_kb") = 64, py::arg("max_read_kb") = 1024,
        py::arg("direct_max_read_kb") = 4096, py::arg("io_direct") = false,
        "Modelled I/O cost per token of the logs' tokens with experts in `slots` (default: the model's maps).");
  m.def("token_read_cost", [](const std::vector<uint32_t>& slots, uint64_t expert_bytes, uint64_t expert_stride,
                              uint64_t data_offset, uint64_t gap_bytes, uint64_t max_read_bytes,
                              uint64_t direct_max_read_bytes, bool direct) {
          if (expert_bytes == 0 || expert_stride < expert_bytes)
            throw ConfigError("token_read_cost: need 0 < expert_bytes <= expert_stride");
          if (max_read_bytes == 0) throw ConfigError("token_read_cost: max_read_bytes must be > 0");
          if (slots.size() > 64) throw ConfigError("token_read_cost: more than 64 slots");
          SlotGeometry g{data_offset, expert_bytes, expert_stride};
          IoEngineOptions io;
          io.coalesce_gap_bytes = gap_bytes;
          io.max_read_bytes = max_read_bytes;
          io.direct_max_read_bytes = direct_max_read_bytes;
          io.direct = direct;
          ReadCost c = token_read_cost(slots, read_by(g, io));
          return py::make_tuple(c.ops, c.bytes);
        }, py::arg("slots"), py::kw_only(), py::arg("expert_bytes"), py::arg("expert_stride"),
        py::arg("data_offset") = 4096, py::arg("gap_bytes") = 64 << 10, py::arg("max_read_bytes") = 1 << 20,
        py::arg("direct_max_read_bytes") = 4 << 20, py::arg("direct") = false,
        "(read ops, bytes moved) for one token whose experts sit in `slots`, coalesced as the engine does.");
  m.def("load_io_profile", [](const fs::path& path) {
          IoProfile p = load_io_profile(path);
          py::dict d;
          d["op_latency_us"] = p.op_latency_us;
          d["iops_limit"] = p.iops_limit;
          d["queue_depth"] = p.queue_depth;
          d["bandwidth_gbps"] = p.bandwidth_gbps;
          d["single_read_gbps"] = p.single_read_gbps;
          return d;
        }, py::arg("path"), "A device profile (bench_io --profile-out, or bench_io's results JSON), validated.");
}

}  // namespace moestream::py_bindings
