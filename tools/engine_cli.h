// The engine options that `infer` and `moestream-server` share (expert reads, host cache,
// checksums, cache-aware routing): one definition of the flags, their help and their mapping.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "loader/store/expert_store.h"
#include "loader/store/store_options.h"
#include "runtime/engine/model.h"

namespace moestream {

struct EngineCliArgs {
  // --io ... --direct-max-read-kb; auto_direct comes from no_auto_direct, verify_checksums from
  // no_verify (through ModelOptions: store_config_for)
  StoreConfig store;
  bool no_verify = false;
  bool no_auto_direct = false;
  bool cache_aware = false;
  float cache_tolerance = 0.10f;
  bool cache_aware_union = false;
  bool gpu = false;
  uint64_t gpu_cache_mb = 0;  // 0 = automatic
  int moe_lookahead = 0;
  bool gpu_sync_layers = false;
  bool gpu_preload = false;
  bool gpu_no_graphs = false;
  bool gpu_pin_page_cache = false;
  bool gpu_cpu_misses = false;
};

// Adds --io, --io-direct, --host-cache-mb, --io-qd, --io-rings, --io-threads, --coalesce-gap-kb,
// --max-read-kb, --direct-max-read-kb, --io-profile, --no-verify, --cache-aware, --cache-tolerance,
// --cache-aware-union, --gpu, --gpu-cache-mb and
// --moe-lookahead to `app`.
void add_engine_options(CLI::App& app, EngineCliArgs& a);

// Sets the ModelOptions fields these flags own (checksums, cache-aware routing, GPU). Throws
// ConfigError at once (before any slow load) for GPU flags that cannot work: --gpu without a
// CUDA build or device, --gpu-cache-mb or --moe-lookahead without --gpu.
void apply_engine_options(const EngineCliArgs& a, ModelOptions& mo);

// Opens the expert store the flags describe (loader/store/store_options.h) for a model loaded with
// `mo` (apply_engine_options'; store_config_for); `tool` prefixes its warnings and the read
// engine's notices on stderr.
std::unique_ptr<ExpertStore> open_engine_store(const EngineCliArgs& a, const ModelOptions& mo,
                                               const std::filesystem::path& dir, const ModelConfig& cfg,
                                               const char* tool);

}  // namespace moestream
