// `cluster_experts`: orders each layer's experts on disk from routing logs so that experts chosen
// together sit together, reports the modelled I/O cost, writes maps and optionally repacks; with
// --bind-legacy-maps it only binds the version-1 maps of a model repacked before maps were bound.
// On a GGUF it writes a new GGUF (--out) with each layer's experts permuted (cluster/gguf_repack.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cluster/cluster_inputs.h"
#include "cluster/cluster_plan.h"
#include "cluster/ordering.h"
#include "cluster/repack.h"
#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "loader/format/model_config.h"
#include "loader/store/store_options.h"
#include "loader/format/expert_prior.h"
#include "tools/cli_range.h"
#include "tools/tool_main.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::cluster;

namespace {

struct Args {
  std::vector<std::string> routing, evaluate;
  std::string prior_out;
  std::string model, method = "seriation", maps_out, out;
  bool repack = false, json = false, shape_only = false, bind_legacy = false;
  double op_latency_us = 0, bandwidth_gbps = 0, neighbour_weight = 0;
  uint64_t search_moves = kDefaultSearchMoves;
  // The engine's read options, with infer's flags and defaults (coalescing gap, read caps,
  // O_DIRECT), turned into the engine's options by the store options' one builder.
  StoreConfig reads;
};

int run(const Args& a) {
  const fs::path dir = a.model;
  require_model_location(dir);  // what --model is, before any option is judged by it
  if (a.bind_legacy) {
    const int n = bind_legacy_maps(dir);
    std::fprintf(stderr, "cluster_experts: bound %d version-1 map(s) under %s/experts to their layer files\n", n,
                 dir.string().c_str());
    return 0;
  }
  if (a.routing.empty()) throw ConfigError("--routing is required (except with --bind-legacy-maps)");
  const bool gguf = is_gguf_file(dir);
  if (gguf && (a.repack || !a.maps_out.empty()))
    throw ConfigError(dir.string() + " is a GGUF: it is never rewritten in place and has no maps; give --out NEW.gguf "
                      "to write a permuted copy");
  if (!gguf && !a.out.empty())
    throw ConfigError("--out writes a permuted GGUF and needs a .gguf --model; a packed model is repacked in place "
                      "with --repack");
  ClusterRequest req;
  req.method = a.method;
  req.profile = io_profile_of(a.reads.io_profile, a.op_latency_us, a.bandwidth_gbps);
  req.coactivation.neighbour_weight = a.neighbour_weight;
  req.search_moves = a.search_moves;
  req.maps_out = a.maps_out;
  req.repack = a.repack;
  req.gguf_out = a.out;
  auto say = [](const std::string& line) { std::fprintf(stderr, "cluster_experts: %s\n", line.c_str()); };
  req.progress = say;
  const ClusterModel model = ClusterModel::read(dir, build_store_options(a.reads).io);
  check_cluster_request(model, req);
  const std::vector<RoutingLog> train = model.load_logs(a.routing, a.shape_only, say);
  if (!a.prior_out.empty()) {  // the foresight cache policy's prior (loader/format/expert_prior.h)
    write_expert_prior(a.prior_out, expert_prior_from_logs(train));
    say("wrote the expert prior " + a.prior_out);
  }
  const std::vector<RoutingLog> heldout =
      a.evaluate.empty() ? std::vector<RoutingLog>{} : model.load_logs(a.evaluate, a.shape_only, say);
  const ClusterResult r = run_cluster(model, train, heldout, req);

  for (const char* set : {"train", "heldout"}) {
    if (!r.report.contains(set)) continue;
    std::fprintf(stderr, "%-9s %-10s %12s %14s %16s\n", set, "method", "ops/token", "KiB/token", "modelled us/tok");
    for (const char* m : {"identity", "greedy", "chosen"}) {
      const nlohmann::json& c = r.report[set][m];
      std::fprintf(stderr, "%-9s %-10s %12.3f %14.1f %16.1f\n", set,
                   std::string(m) == "chosen" ? a.method.c_str() : m, c["read_ops_per_token"].get<double>(),
                   c["bytes_per_token"].get<double>() / 1024, c["modelled_us_per_token"].get<double>());
    }
  }
  if (a.json) std::printf("%s\n", r.report.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cluster_experts: place co-activated experts next to each other on disk"};
  Args a;
  app.add_option("--routing", a.routing, "routing log(s) to learn the order from (infer --collect-routing)")
      ->expected(1, -1);
  app.add_option("--model", a.model, "packed model directory, or a .gguf file")->required();
  app.add_option("--method", a.method, "identity, greedy (chain baseline) or seriation "
                 "(spectral + local search on the cost model)")->capture_default_str();
  app.add_flag("--repack", a.repack, "rewrite the layer files in the new physical order and install the maps");
  app.add_option("--out", a.out, "GGUF model only: write a new GGUF here with each layer's experts (router rows "
                 "and expert tensors) permuted into the computed order and the permutation recorded in its "
                 "metadata (the source is never changed)");
  app.add_option("--maps-out", a.maps_out, "write the orders as DIR/experts/layer_NNN.map (for inspection; "
                 "each map is bound to the file a repack in its order writes, and refused next to any other)");
  app.add_flag("--bind-legacy-maps", a.bind_legacy,
               "only bind the version-1 maps of a model repacked by an earlier moestream to its layer files "
               "(vouching that experts/ was not changed since that repack); needs no --routing");
  app.add_option("--prior-out", a.prior_out,
                 "also write each expert's share of its layer's demand in the --routing logs here "
                 "(an expert prior for the foresight cache policy, docs/format.md)");
  app.add_option("--evaluate", a.evaluate, "held-out routing log(s) to report the cost on")->expected(1, -1);
  app.add_flag("--shape-only", a.shape_only,
               "accept logs of another model with the same layers and experts (e.g. to lay out a "
               "synthetic stand-in with real routing)");
  app.add_flag("--json", a.json, "print a JSON summary on stdout");
  app.add_option("--io-profile", a.reads.io_profile,
                 "device profile (bench_io --profile-out, or bench_io's results JSON): prices reads with "
                 "its latency and bandwidth, and plans them with the engine's merge rule of that profile "
                 "(as infer --io-profile)");
  app.add_option("--op-latency-us", a.op_latency_us, "per-read latency in us (overrides --io-profile; default 80)")
      ->check(in_range(0.0, 1e9));
  app.add_option("--bandwidth-gbps", a.bandwidth_gbps, "device bandwidth in GB/s (overrides --io-profile; default 3)")
      ->check(in_range(0.0, 1e6));
  app.add_option("--neighbour-weight", a.neighbour_weight,
                 "weight of pairs chosen by consecutive tokens in the co-activation counts")->capture_default_str()
      ->check(in_range(0.0, 1e6));
  app.add_option("--search-moves", a.search_moves,
                 "local search budget: candidate moves priced per layer (seriation; a count, not a "
                 "clock, so the order is the same on every machine)")->capture_default_str()
      ->check(in_range<uint64_t>(0, UINT64_MAX));
  app.add_option("--coalesce-gap-kb", a.reads.coalesce_gap_kb,
                 "engine coalescing gap, 0 = no coalescing (as infer --coalesce-gap-kb)")->capture_default_str()
      ->check(in_range(uint64_t(0), kMaxCoalesceGapKb));
  app.add_option("--max-read-kb", a.reads.max_read_kb, "engine largest read (as infer --max-read-kb)")->capture_default_str()
      ->check(in_range(kMinReadKb, kMaxReadKb));
  app.add_option("--direct-max-read-kb", a.reads.direct_max_read_kb,
                 "engine largest read with --io-direct (as infer --direct-max-read-kb)")->capture_default_str()
      ->check(in_range(kMinReadKb, kMaxReadKb));
  app.add_flag("--io-direct", a.reads.io_direct,
               "price reads as the engine issues them with O_DIRECT (as infer --io-direct: block-aligned, "
               "capped by --direct-max-read-kb)");
  return run_tool("cluster_experts", app, argc, argv, [&] { return run(a); });
}
