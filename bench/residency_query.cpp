// bench_residency: what ExpertStore::residency() costs per layer (the cache-aware router asks it
// per layer per token), buffered (sampled page-cache probes) and O_DIRECT with a host cache.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "loader/store/engine_expert_store.h"
#include "loader/format/model_config.h"

using namespace moestream;

int main(int argc, char** argv) {
  CLI::App app{"bench_residency: cost of ExpertStore::residency() per layer"};
  std::string model;
  int reps = 200;
  uint64_t host_cache_mb = 256;
  app.add_option("-m,--model", model, "packed model directory")->required();
  app.add_option("--reps", reps, "queries of every layer")->capture_default_str();
  app.add_option("--host-cache-mb", host_cache_mb, "host cache for the O_DIRECT store")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig cfg = ModelConfig::load(model);
    for (bool direct : {false, true}) {
      EngineExpertStoreOptions o;
      o.io.direct = direct;
      o.host_cache_bytes = direct ? host_cache_mb << 20 : 0;
      auto store = open_expert_store("auto", model, cfg, o);
      // Touch the first top-k experts of every layer so some are resident.
      std::vector<int> ids(size_t(cfg.n_experts_per_tok));
      std::iota(ids.begin(), ids.end(), 0);
      std::vector<const uint8_t*> out;
      for (int l = 0; l < cfg.n_moe_layers(); ++l) store->fetch(l, ids, out);
      std::vector<ExpertTier> tiers(size_t(cfg.n_experts));
      size_t counts[3] = {0, 0, 0};
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r)
        for (int l = 0; l < cfg.n_moe_layers(); ++l) store->residency(l, tiers);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                        (double(reps) * cfg.n_moe_layers());
      for (ExpertTier t : tiers) ++counts[size_t(t)];
      std::printf("%-45s: %8.1f us per layer query of %d experts (%.2f us per expert); last layer: "
                  "%zu host cache, %zu page cache, %zu storage\n",
                  store->describe().substr(0, 45).c_str(), us, cfg.n_experts, us / cfg.n_experts,
                  counts[2], counts[1], counts[0]);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_residency: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
