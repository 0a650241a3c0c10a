// Implementation of cluster/cluster_inputs.h.
#include "cluster/cluster_inputs.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/format/expert_file.h"

namespace fs = std::filesystem;

namespace moestream::cluster {

PackedLayout read_packed_layout(const fs::path& dir, const IoEngineOptions& reads) {
  if (!fs::is_regular_file(dir / "model.json"))
    throw IoError(dir.string() + "/model.json does not exist: not a packed model directory");
  std::vector<ExpertFileHeader> headers;
  for (int l = 0; fs::exists(expert_file_path(dir, l)); ++l) headers.push_back(read_expert_header(expert_file_path(dir, l)));
  if (headers.empty()) throw IoError(expert_file_path(dir, 0).string() + " does not exist");
  const ExpertFileHeader& h0 = headers.front();
  PackedLayout out;
  for (int l = 0; l < int(headers.size()); ++l) {
    const ExpertFileHeader& h = headers[size_t(l)];
    // Expert sizes may differ between layers (a pack converted from a mixed GGUF); the slot stride,
    // which sets the read geometry, may not.
    if (h.n_experts != h0.n_experts || h.expert_stride != h0.expert_stride)
      throw FormatError(expert_file_path(dir, l).string() + ": expert count or slot stride differs from layer 0");
    out.geometry.expert_bytes = std::max<uint64_t>(out.geometry.expert_bytes, h.expert_bytes);
    // A bad map, or one not bound to its file, is an error here.
    out.maps.push_back(load_bound_expert_map(expert_map_path(dir, l), h, expert_file_path(dir, l)));
  }
  out.want.model_hash = model_identity_hash(dir);
  out.want.n_layers = uint32_t(headers.size());
  out.want.n_experts = h0.n_experts;
  out.geometry.data_offset = h0.data_offset;
  out.geometry.expert_stride = h0.expert_stride;
  out.geometry = read_by(out.geometry, reads);
  return out;
}

std::vector<RoutingLog> read_routing_logs(const std::vector<std::string>& paths,
                                          const std::function<void(const std::string&)>& notice,
                                          const std::function<void(const std::string& path, RoutingLog& log)>& accept) {
  if (paths.empty()) throw ConfigError("routing: no routing log given");
  std::vector<RoutingLog> logs;
  for (const std::string& p : paths) {
    if (notice) notice("reading " + p);
    RoutingLog log = read_routing_log(p);
    if (notice && !log.warning.empty()) notice("warning: " + log.warning);
    accept(p, log);
    if (log.records.empty()) throw ConfigError(p + ": routing log holds no records");
    logs.push_back(std::move(log));
  }
  return logs;
}

ConfigError another_model_error(const std::string& path, const RoutingLogHeader& got, const fs::path& model,
                                const std::string& want_hashes, const RoutingLogHeader& want) {
  return ConfigError(path + ": routing log of another model (model_hash " + std::to_string(got.model_hash) + ", " +
                     std::to_string(got.n_layers) + " layers, " + std::to_string(got.n_experts) + " experts) than " +
                     model.string() + " (model_hash " + want_hashes + ", " + std::to_string(want.n_layers) +
                     " layers, " + std::to_string(want.n_experts) + " experts)");
}

std::vector<RoutingLog> load_routing_logs(const std::vector<std::string>& paths, const RoutingLogHeader& want,
                                          const fs::path& model, bool shape_only,
                                          const std::function<void(const std::string&)>& notice) {
  return read_routing_logs(paths, notice, [&](const std::string& p, const RoutingLog& log) {
    const RoutingLogHeader& h = log.header;
    if ((!shape_only && h.model_hash != want.model_hash) || h.n_layers != want.n_layers || h.n_experts != want.n_experts)
      throw another_model_error(p, h, model, std::to_string(want.model_hash), want);
  });
}

IoProfile io_profile_of(const fs::path& profile_json, double op_latency_us, double bandwidth_gbps) {
  IoProfile prof;
  if (!profile_json.empty()) prof = load_io_profile(profile_json);
  if (op_latency_us > 0) prof.op_latency_us = op_latency_us;
  if (bandwidth_gbps > 0) prof.bandwidth_gbps = bandwidth_gbps;
  return prof;
}

nlohmann::json cost_json(const CostSummary& c) {
  return {{"tokens", c.tokens}, {"read_ops_per_token", c.ops_per_token},
          {"bytes_per_token", c.bytes_per_token}, {"modelled_us_per_token", c.modelled_us_per_token}};
}

nlohmann::json geometry_json(const SlotGeometry& g) {
  return {{"expert_bytes", g.expert_bytes}, {"expert_stride", g.expert_stride},
          {"coalesce", g.reads.coalesce}, {"gap_bytes", g.reads.gap_bytes},
          {"max_read_bytes", g.reads.max_read_bytes},
          {"direct_max_read_bytes", g.reads.direct_max_read_bytes}, {"direct", g.direct},
          {"merge_rule", g.reads.merge.enabled}};
}

}  // namespace moestream::cluster
