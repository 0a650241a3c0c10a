// What cluster_experts and Python's moestream.cluster() / cost() read before they order or price:
// a packed model's slot geometry and current maps (from its layer files: cluster/ knows files,
// not models), routing logs checked against that model, and the device's I/O profile; and the
// JSON both report costs in.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cluster/io_cost_model.h"
#include "common/error.h"
#include "loader/format/expert_map.h"
#include "loader/format/routing_log.h"
#include "loader/io/io_engine.h"

namespace moestream::cluster {

struct PackedLayout {
  RoutingLogHeader want;        // model_hash, layers and experts a routing log must match
  std::vector<ExpertMap> maps;  // each layer's current map (identity where it has none)
  SlotGeometry geometry;        // priced as an engine with the given read options reads
};

// Reads the layer files of model directory `dir`: IoError when it holds no model.json or no
// experts/layer_000.bin, FormatError when a layer's expert count or size differs from layer 0's
// or its map is bad.
PackedLayout read_packed_layout(const std::filesystem::path& dir, const IoEngineOptions& reads);

// Reads the routing logs at `paths` (ConfigError when there is none) and checks each against
// `want` (its model hash unless `shape_only`, its layers and experts: ConfigError naming both
// sides) and that it holds records. `notice`, when set, receives "reading <path>" before each
// log and "warning: <text>" for a log read with a warning.
std::vector<RoutingLog> load_routing_logs(const std::vector<std::string>& paths, const RoutingLogHeader& want,
                                          const std::filesystem::path& model, bool shape_only,
                                          const std::function<void(const std::string&)>& notice = {});

// What load_routing_logs and load_gguf_routing_logs share: the logs at `paths` read in turn
// (ConfigError when there is none; `notice` as above), each handed to `accept`, which throws for
// a log of another model (another_model_error) or adapts it to this one, then refused when it
// holds no records.
std::vector<RoutingLog> read_routing_logs(const std::vector<std::string>& paths,
                                          const std::function<void(const std::string&)>& notice,
                                          const std::function<void(const std::string& path, RoutingLog& log)>& accept);

// "<path>: routing log of another model (its hash, layers, experts) than <model> (model_hash
// <want_hashes>, want's layers and experts)"; want_hashes is the hash or hashes `model` accepts.
ConfigError another_model_error(const std::string& path, const RoutingLogHeader& got,
                                const std::filesystem::path& model, const std::string& want_hashes,
                                const RoutingLogHeader& want);

// The device profile in `profile_json` (load_io_profile; IoProfile's defaults when empty), then
// each of latency and bandwidth overridden where > 0.
IoProfile io_profile_of(const std::filesystem::path& profile_json, double op_latency_us, double bandwidth_gbps);

// {tokens, read_ops_per_token, bytes_per_token, modelled_us_per_token}
nlohmann::json cost_json(const CostSummary& c);
// {expert_bytes, expert_stride, coalesce, gap_bytes, max_read_bytes, direct_max_read_bytes, direct, merge_rule}
nlohmann::json geometry_json(const SlotGeometry& g);

}  // namespace moestream::cluster
