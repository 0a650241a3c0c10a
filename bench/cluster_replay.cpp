// cluster_replay: replays a routing log's per-token expert choices through the expert store (no
// model math) and measures cold expert-read time per token, e.g. identity vs repacked files.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

#include "common/error.h"
#include "common/timing.h"
#include "loader/format/routing_log.h"
#include "loader/store/engine_expert_store.h"
#include "loader/store/store_options.h"
#include "loader/format/model_config.h"
#include "runtime/convert/synthetic_model.h"

using namespace moestream;

int main(int argc, char** argv) {
  CLI::App app{"cluster_replay: cold expert-read time per token replaying a routing log"};
  std::string model, log_path, io = "uring", io_profile;
  bool direct = true;
  size_t max_tokens = 2000;
  uint32_t qd = 32, rings = 0;
  bool shape_only = false;
  std::string write_synthetic;
  int hidden = 1024, ffn = 512;
  app.add_option("--model", model, "packed model directory (required unless --write-synthetic)");
  app.add_option("--routing", log_path, "routing log to replay (one fetch per token and layer)")->required();
  app.add_option("--io", io, "store backend (as infer --io)")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "tokens to replay (0 = all)")->capture_default_str();
  app.add_flag("--direct,!--buffered", direct, "O_DIRECT reads (default) or buffered")->capture_default_str();
  app.add_option("--io-qd", qd, "reads in flight per ring (1 = one read at a time)")->capture_default_str();
  app.add_option("--io-rings", rings, "io_uring rings; 0 = the engine's default")->capture_default_str();
  app.add_option("--io-profile", io_profile,
                 "device profile (bench_io --profile-out): the engine's per-batch merge rule (as infer --io-profile)");
  app.add_flag("--shape-only", shape_only,
               "replay a log of another model with the same layers/experts (a synthetic stand-in)");
  app.add_option("--write-synthetic", write_synthetic,
                 "write a seeded random q8 model with the log's layers, experts and top-k into "
                 "this directory (experts sized by --hidden/--ffn) and exit; --model is ignored");
  app.add_option("--hidden", hidden, "synthetic model width")->capture_default_str();
  app.add_option("--ffn", ffn, "synthetic expert width")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (!write_synthetic.empty()) {
      const RoutingLogHeader h = read_routing_log(log_path).header;
      const ModelConfig c = make_model_config(
          Arch::kQwen3Moe,
          {.vocab = 256, .hidden = hidden, .layers = int(h.n_layers), .heads = 4, .kv_heads = 2, .head_dim = 32,
           .expert_width = ffn, .experts = int(h.n_experts), .top_k = int(h.top_k), .max_positions = 512},
          QkNorm::kPerHead, QuantType::kQ8);
      write_synthetic_model(write_synthetic, c, 77);
      std::fprintf(stderr, "cluster_replay: wrote %s\n", write_synthetic.c_str());
      return 0;
    }
    if (model.empty()) throw ConfigError("--model is required");
    const ModelConfig cfg = ModelConfig::load(model);
    StoreConfig sc;
    sc.io = io;
    sc.io_direct = direct;
    sc.io_qd = qd;
    sc.io_rings = rings;
    sc.host_cache_mb = 0;  // every fetch is a cold read from the device
    sc.io_profile = io_profile;
    EngineExpertStoreOptions so = build_store_options(sc);
    // Not a user option, so StoreConfig lacks it: the residency probes would add two system calls
    // per miss to the reads this tool times.
    so.count_page_cache_hits = false;
    auto store = open_expert_store(io, model, cfg, so);
    const RoutingLog log = read_routing_log(log_path);
    if (!log.warning.empty()) std::fprintf(stderr, "cluster_replay: warning: %s\n", log.warning.c_str());
    if (shape_only ? (log.header.n_layers != uint32_t(cfg.n_layers) || log.header.n_experts != uint32_t(cfg.n_experts))
                   : log.header.model_hash != model_identity_hash(model))
      throw ConfigError(log_path + ": routing log of another model than " + model);
    std::vector<const uint8_t*> out;
    std::vector<int> ids;
    size_t tokens = 0;
    double seconds = 0;
    for (const RoutingRecord& r : log.records) {
      if (r.layer == 0) {
        if (max_tokens && tokens == max_tokens) break;
        ++tokens;
      }
      ids.assign(r.ids.begin(), r.ids.end());
      auto t0 = std::chrono::steady_clock::now();
      store->fetch(r.layer, ids, out);
      seconds += seconds_since(t0);
    }
    const ExpertStoreStats st = store->stats();
    std::printf("{\"model\": \"%s\", \"tokens\": %zu, \"us_per_token\": %.1f, \"read_ops_per_token\": %.3f, "
                "\"bytes_per_token\": %.0f, \"store\": \"%s\"}\n",
                model.c_str(), tokens, seconds * 1e6 / double(tokens),
                double(st.read_ops_issued) / double(tokens), double(st.bytes_transferred) / double(tokens),
                store->describe().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "cluster_replay: error: %s\n", e.what());
    return 1;
  }
}
