// One clustering run, as `cluster_experts` and Python's moestream.cluster() both do it: read the
// model's layout (a packed directory or a GGUF), check the routing logs against it, order every
// layer with the baselines beside the chosen method, price the orders, and write what was asked
// (maps, an in-place repack of a pack, a permuted copy of a GGUF). The two front ends differ only
// in how they spell options and print.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/cluster_inputs.h"
#include "cluster/coactivation.h"
#include "cluster/gguf_repack.h"
#include "cluster/io_cost_model.h"
#include "cluster/ordering.h"

namespace moestream::cluster {

// A packed directory or a GGUF file, as the clusterer sees it.
struct ClusterModel {
  std::filesystem::path path;
  std::optional<GgufLayout> gguf;  // set for a GGUF
  PackedLayout layout;             // gguf->packed for a GGUF

  // Reads `path` (is_gguf_file decides which reader).
  static ClusterModel read(const std::filesystem::path& path, const IoEngineOptions& reads);
  // The routing logs at `paths` checked against this model (a GGUF maps logs of its original).
  std::vector<RoutingLog> load_logs(const std::vector<std::string>& paths, bool shape_only,
                                    const std::function<void(const std::string&)>& notice = {}) const;
};

// What to order by and what to write. At most one of repack (pack only) and gguf_out (GGUF
// only) applies; ConfigError for the other combinations, before any work.
struct ClusterRequest {
  std::string method = "seriation";
  IoProfile profile;
  CoactivationOptions coactivation;
  uint64_t search_moves = kDefaultSearchMoves;
  std::filesystem::path maps_out;  // pack only: DIR/experts/layer_NNN.map, bound to the repack's files
  bool repack = false;             // pack only: rewrite the layer files in place
  std::filesystem::path gguf_out;  // GGUF only: the permuted copy
  // Progress lines for a person ("layer 3/48 ordered ..."); never changes a result.
  std::function<void(const std::string&)> progress;
};

struct ClusterResult {
  std::vector<LayerStats> train;
  // [method][layer][logical expert] = physical slot; methods: identity, greedy, chosen.
  std::vector<std::vector<std::vector<uint32_t>>> slots;
  uint64_t moves = 0;
  nlohmann::json report;  // model, method, io_profile, geometry, search, train/heldout costs, out, repacked
};

// Checks `req` against `model` (ConfigError naming the option), orders, prices on `train` and
// (when not empty) `heldout`, and writes the outputs.
ClusterResult run_cluster(const ClusterModel& model, const std::vector<RoutingLog>& train,
                          const std::vector<RoutingLog>& heldout, const ClusterRequest& req);

// The same checks alone, for front ends that want to refuse before reading any routing log.
void check_cluster_request(const ClusterModel& model, const ClusterRequest& req);

}  // namespace moestream::cluster
