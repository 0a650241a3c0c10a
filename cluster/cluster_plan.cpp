#include "cluster/cluster_plan.h"

#include <chrono>
#include <cstdio>

#include "cluster/repack.h"
#include "common/error.h"
#include "common/timing.h"
#include "loader/format/expert_map.h"
#include "loader/format/gguf_model.h"

namespace fs = std::filesystem;

namespace moestream::cluster {
namespace {

std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

ClusterModel ClusterModel::read(const fs::path& path, const IoEngineOptions& reads) {
  ClusterModel m;
  m.path = path;
  if (is_gguf_file(path)) {
    m.gguf = read_gguf_layout(path, reads);
    m.layout = m.gguf->packed;
  } else {
    m.layout = read_packed_layout(path, reads);
  }
  return m;
}

std::vector<RoutingLog> ClusterModel::load_logs(const std::vector<std::string>& paths, bool shape_only,
                                                const std::function<void(const std::string&)>& notice) const {
  return gguf ? load_gguf_routing_logs(paths, *gguf, path, shape_only, notice)
              : load_routing_logs(paths, layout.want, path, shape_only, notice);
}

void check_cluster_request(const ClusterModel& model, const ClusterRequest& req) {
  parse_order_method(req.method);  // ConfigError naming a bad method
  if (model.gguf && (req.repack || !req.maps_out.empty()))
    throw ConfigError(model.path.string() + " is a GGUF: it is never rewritten in place and has no maps; "
                      "give an output path for a permuted copy instead");
  if (!model.gguf && !req.gguf_out.empty())
    throw ConfigError("a permuted GGUF output needs a .gguf model; a packed model is repacked in place");
}

ClusterResult run_cluster(const ClusterModel& model, const std::vector<RoutingLog>& train,
                          const std::vector<RoutingLog>& heldout, const ClusterRequest& req) {
  check_cluster_request(model, req);
  const OrderMethod method = parse_order_method(req.method);
  const SlotGeometry& g = model.layout.geometry;
  auto say = [&](const std::string& line) {
    if (req.progress) req.progress(line);
  };
  ClusterResult r;
  r.train = coactivation(train, req.coactivation);
  say(format("%zu tokens x %zu layers from %zu log(s); %.1f us per serial op, %.2f GB/s%s",
             r.train[0].token_sets.size(), r.train.size(), train.size(), serial_op_us(req.profile),
             req.profile.bandwidth_gbps, g.reads.merge.enabled ? "; reads planned by the profile's merge rule" : ""));

  // Identity and greedy are cheap baselines; the chosen method's order is what gets written.
  const OrderMethod methods[] = {OrderMethod::kIdentity, OrderMethod::kGreedy, method};
  r.slots.resize(3);
  LocalSearchOptions ls;
  ls.max_moves = req.search_moves;
  const size_t n_layers = r.train.size();
  for (size_t m = 0; m < 3; ++m) {
    if (m == 2 && method != OrderMethod::kSeriation) {
      r.slots[2] = r.slots[size_t(method)];
      break;
    }
    for (size_t l = 0; l < n_layers; ++l) {
      using clock = std::chrono::steady_clock;
      const auto t0 = clock::now();
      auto shown = t0;
      // A line every few seconds on long searches; the clock decides only what is printed.
      ls.progress = [&](const SearchProgress& q) {
        const auto now = clock::now();
        if (now - shown < std::chrono::seconds(5)) return;
        shown = now;
        say(format("layer %zu/%zu: %d passes, %llu/%llu moves", l + 1, n_layers, q.passes,
                   (unsigned long long)q.moves, (unsigned long long)q.max_moves));
      };
      SearchStats st;
      std::vector<uint32_t> slots = slots_of(order_layer(methods[m], r.train[l], g, req.profile, ls, &st));
      // A GGUF's ids are its positions: grouped routing needs each expert to stay in its group.
      if (model.gguf && model.gguf->routing_groups > 1) slots = slots_within_groups(slots, model.gguf->routing_groups);
      r.slots[m].push_back(std::move(slots));
      r.moves += st.moves;
      if (methods[m] == OrderMethod::kSeriation)
        say(format("layer %zu/%zu ordered (seriation, %llu moves in %d passes, %s, %.1f s)", l + 1, n_layers,
                   (unsigned long long)st.moves, st.passes,
                   st.converged ? "no move left that helps" : "stopped by the move budget", seconds_since(t0)));
    }
  }

  nlohmann::json& js = r.report;
  js["model"] = model.path.string();
  js["method"] = req.method;
  js["io_profile"] = {{"op_latency_us", req.profile.op_latency_us}, {"bandwidth_gbps", req.profile.bandwidth_gbps},
                      {"iops_limit", req.profile.iops_limit}, {"queue_depth", req.profile.queue_depth},
                      {"single_read_gbps", req.profile.single_read_gbps}, {"serial_op_us", serial_op_us(req.profile)}};
  js["geometry"] = geometry_json(g);
  js["search"] = {{"max_moves_per_layer", req.search_moves}, {"moves", r.moves}};
  auto price = [&](const char* set, const std::vector<LayerStats>& st) {
    const char* names[] = {"identity", "greedy", "chosen"};
    for (size_t m = 0; m < 3; ++m) js[set][names[m]] = cost_json(model_cost(st, r.slots[m], g, req.profile));
  };
  price("train", r.train);
  if (!heldout.empty()) price("heldout", coactivation(heldout));

  const auto& chosen = r.slots[2];
  std::vector<ExpertMap> maps;
  for (size_t l = 0; l < chosen.size(); ++l)
    maps.push_back(ExpertMap::from_slots(chosen[l], "computed order of layer " + std::to_string(l)));
  if (!req.maps_out.empty()) {
    // Bound to the files a repack in this order would write: never usable next to the current ones.
    const std::vector<ExpertMap> bound = bind_for_repack(model.path, maps);
    fs::create_directories(req.maps_out / "experts");
    for (size_t l = 0; l < bound.size(); ++l) write_expert_map(expert_map_path(req.maps_out, int(l)), bound[l]);
    say(format("wrote %zu maps under %s/experts", maps.size(), req.maps_out.c_str()));
  }
  if (req.repack) {
    RepackOptions ro;
    ro.progress = [&](int l, int n) { say(format("repacked layer %d/%d", l, n)); };
    repack_experts(model.path, int(maps.size()), maps, ro);
    say(format("%s/experts repacked in %s order, maps installed", model.path.c_str(), req.method.c_str()));
  }
  if (!req.gguf_out.empty()) {
    std::vector<std::vector<uint32_t>> order;
    for (const auto& s : chosen) order.push_back(order_of_slots(s));
    GgufRepackOptions ro;
    ro.progress = [&](int l, int n) { say(format("permuted the experts of layer %d/%d", l, n)); };
    const auto t0 = std::chrono::steady_clock::now();
    const GgufRepackResult w = repack_gguf_experts(model.path, req.gguf_out, order, ro);
    const double s = seconds_since(t0);
    say(format("wrote %s (%llu bytes, %u expert tensors permuted, %u copied, %.2f s) in %s order",
               req.gguf_out.c_str(), (unsigned long long)w.bytes_written, w.tensors_permuted, w.tensors_copied, s,
               req.method.c_str()));
    js["out"] = {{"path", req.gguf_out.string()}, {"bytes", w.bytes_written},
                 {"tensors_permuted", w.tensors_permuted}, {"tensors_copied", w.tensors_copied}, {"seconds", s}};
  }
  js["repacked"] = req.repack || !req.gguf_out.empty();
  return r;
}

}  // namespace moestream::cluster
