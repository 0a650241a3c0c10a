// `cluster_experts`: orders each layer's experts on disk from routing logs so that experts chosen
// together sit together, reports the modelled I/O cost, writes maps and optionally repacks; with
// --bind-legacy-maps it only binds the version-1 maps of a model repacked before maps were bound.
// On a GGUF it writes a new GGUF (--out) with each layer's experts permuted (cluster/gguf_repack.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cluster/cluster_inputs.h"
#include "cluster/coactivation.h"
#include "cluster/gguf_repack.h"
#include "cluster/io_cost_model.h"
#include "cluster/ordering.h"
#include "cluster/repack.h"
#include "common/error.h"
#include "common/file_util.h"
#include "common/timing.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/format/gguf_model.h"
#include "loader/format/routing_log.h"
#include "loader/store/store_options.h"
#include "tools/cli_range.h"
#include "tools/tool_main.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::cluster;

namespace {

struct Args {
  std::vector<std::string> routing, evaluate;
  std::string model, method = "seriation", io_profile, maps_out, out;
  bool repack = false, json = false, shape_only = false, bind_legacy = false;
  double op_latency_us = 0, bandwidth_gbps = 0, neighbour_weight = 0;
  uint64_t search_moves = kDefaultSearchMoves;
  // The engine's read options, with infer's flags and defaults (coalescing gap, read caps,
  // O_DIRECT), turned into the engine's options by the store options' one builder.
  StoreConfig reads;
};

int run(const Args& a) {
  const fs::path dir = a.model;
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
  std::optional<GgufLayout> glayout;
  if (gguf) glayout = read_gguf_layout(dir, build_store_options(a.reads).io);
  const PackedLayout layout = gguf ? glayout->packed : read_packed_layout(dir, build_store_options(a.reads).io);
  const RoutingLogHeader& want = layout.want;
  const SlotGeometry& g = layout.geometry;
  auto load_logs = [&](const std::vector<std::string>& paths, auto notice_fn) {
    return gguf ? load_gguf_routing_logs(paths, *glayout, dir, a.shape_only, notice_fn)
                : load_routing_logs(paths, want, dir, a.shape_only, notice_fn);
  };
  const IoProfile prof = io_profile_of(a.io_profile, a.op_latency_us, a.bandwidth_gbps);
  const OrderMethod method = parse_order_method(a.method);

  auto notice = [](const std::string& line) { std::fprintf(stderr, "cluster_experts: %s\n", line.c_str()); };
  const std::vector<RoutingLog> train = load_logs(a.routing, notice);
  CoactivationOptions co;
  co.neighbour_weight = a.neighbour_weight;
  const std::vector<LayerStats> stats = coactivation(train, co);
  std::fprintf(stderr, "cluster_experts: %zu tokens x %zu layers from %zu log(s); latency %.1f us/op, %.2f GB/s\n",
               stats[0].token_sets.size(), stats.size(), train.size(), prof.op_latency_us, prof.bandwidth_gbps);

  // Orders for the three methods (identity and greedy are cheap; the chosen one is what is written).
  const std::vector<OrderMethod> methods = {OrderMethod::kIdentity, OrderMethod::kGreedy, method};
  const char* names[] = {"identity", "greedy", "seriation"};
  std::vector<std::vector<std::vector<uint32_t>>> slots(3);
  LocalSearchOptions ls;
  ls.max_moves = a.search_moves;
  uint64_t moves_total = 0;
  for (size_t m = 0; m < methods.size(); ++m) {
    if (m == 2 && method != OrderMethod::kSeriation) {
      slots[2] = slots[size_t(method)];
      break;
    }
    for (size_t l = 0; l < stats.size(); ++l) {
      using clock = std::chrono::steady_clock;
      const auto t0 = clock::now();
      auto shown = t0;
      // A line every few seconds on long searches; the clock decides only what is printed.
      ls.progress = [&](const SearchProgress& q) {
        const auto now = clock::now();
        if (now - shown < std::chrono::seconds(5)) return;
        shown = now;
        std::fprintf(stderr, "cluster_experts: layer %zu/%zu: %d passes, %llu/%llu moves\n", l + 1,
                     stats.size(), q.passes, (unsigned long long)q.moves, (unsigned long long)q.max_moves);
      };
      SearchStats st;
      slots[m].push_back(slots_of(order_layer(methods[m], stats[l], g, prof, ls, &st)));
      moves_total += st.moves;
      if (methods[m] == OrderMethod::kSeriation)
        std::fprintf(stderr, "cluster_experts: layer %zu/%zu ordered (%s, %llu moves in %d passes, %s, %.1f s)\n",
                     l + 1, stats.size(), names[m], (unsigned long long)st.moves, st.passes,
                     st.converged ? "no move left that helps" : "stopped by the move budget",
                     seconds_since(t0));
    }
  }
  const auto& chosen = slots[2];

  nlohmann::json js;
  js["model"] = dir.string();
  js["method"] = a.method;
  js["io_profile"] = {{"op_latency_us", prof.op_latency_us}, {"bandwidth_gbps", prof.bandwidth_gbps}};
  js["geometry"] = geometry_json(g);
  js["search"] = {{"max_moves_per_layer", a.search_moves}, {"moves", moves_total}};
  auto report = [&](const char* set, const std::vector<LayerStats>& st) {
    std::fprintf(stderr, "%-9s %-10s %12s %14s %16s\n", set, "method", "ops/token", "KiB/token", "modelled us/tok");
    for (int m = 0; m < 3; ++m) {
      CostSummary c = model_cost(st, slots[size_t(m)], g, prof);
      const char* name = m < 2 ? names[m] : a.method.c_str();
      std::fprintf(stderr, "%-9s %-10s %12.3f %14.1f %16.1f\n", set, name, c.ops_per_token,
                   c.bytes_per_token / 1024, c.modelled_us_per_token);
      js[set][m < 2 ? std::string(names[m]) : "chosen"] = cost_json(c);
    }
  };
  report("train", stats);
  if (!a.evaluate.empty()) report("heldout", coactivation(load_logs(a.evaluate, notice)));

  std::vector<ExpertMap> maps;
  for (size_t l = 0; l < chosen.size(); ++l)
    maps.push_back(ExpertMap::from_slots(chosen[l], "computed order of layer " + std::to_string(l)));
  if (!a.maps_out.empty()) {
    // Bound to the files a repack in this order would write: never usable next to the current ones.
    const std::vector<ExpertMap> bound = bind_for_repack(dir, maps);
    fs::create_directories(fs::path(a.maps_out) / "experts");
    for (size_t l = 0; l < bound.size(); ++l) write_expert_map(expert_map_path(a.maps_out, int(l)), bound[l]);
    std::fprintf(stderr, "cluster_experts: wrote %zu maps under %s/experts\n", maps.size(), a.maps_out.c_str());
  }
  if (a.repack) {
    RepackOptions ro;
    ro.progress = [](int l, int n) { std::fprintf(stderr, "cluster_experts: repacked layer %d/%d\n", l, n); };
    repack_experts(dir, int(maps.size()), maps, ro);
    std::fprintf(stderr, "cluster_experts: %s/experts repacked in %s order, maps installed\n",
                 dir.string().c_str(), a.method.c_str());
  }
  if (!a.out.empty()) {
    std::vector<std::vector<uint32_t>> order;
    for (const auto& s : chosen) order.push_back(order_of_slots(s));
    GgufRepackOptions ro;
    ro.progress = [](int l, int n) { std::fprintf(stderr, "cluster_experts: permuted the experts of layer %d/%d\n", l, n); };
    const auto t0 = std::chrono::steady_clock::now();
    const GgufRepackResult r = repack_gguf_experts(dir, a.out, order, ro);
    const double s = seconds_since(t0);
    std::fprintf(stderr, "cluster_experts: wrote %s (%llu bytes, %u expert tensors permuted, %u copied, %.2f s) in %s order\n",
                 a.out.c_str(), (unsigned long long)r.bytes_written, r.tensors_permuted, r.tensors_copied, s,
                 a.method.c_str());
    js["out"] = {{"path", a.out}, {"bytes", r.bytes_written}, {"tensors_permuted", r.tensors_permuted},
                 {"tensors_copied", r.tensors_copied}, {"seconds", s}};
  }
  js["repacked"] = a.repack || !a.out.empty();
  if (a.json) std::printf("%s\n", js.dump(2).c_str());
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
  app.add_option("--evaluate", a.evaluate, "held-out routing log(s) to report the cost on")->expected(1, -1);
  app.add_flag("--shape-only", a.shape_only,
               "accept logs of another model with the same layers and experts (e.g. to lay out a "
               "synthetic stand-in with real routing)");
  app.add_flag("--json", a.json, "print a JSON summary on stdout");
  app.add_option("--io-profile", a.io_profile, "bench_io JSON to take per-op latency and bandwidth from");
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
