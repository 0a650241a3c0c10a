// The engine options that `infer` and `moestream-server` share (expert reads, host cache,
// checksums, cache-aware routing): one definition of the flags, their help and their mapping.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "loader/store/expert_store.h"
#include "runtime/engine/model.h"

namespace moestream {

struct EngineCliArgs {
  std::string io = "auto";
  bool io_direct = false;
  uint64_t host_cache_mb = 0, coalesce_gap_kb = 64, max_read_kb = 1024, direct_max_read_kb = 4096;
  uint32_t io_qd = 32, io_rings = 0, io_threads = 0;  // 0 = the engine's default
  bool no_verify = false;
  bool cache_aware = false;
  float cache_tolerance = 0.10f;
  bool gpu = false;
  uint64_t gpu_cache_mb = 0;  // 0 = automatic
  int moe_lookahead = 0;
};

// Adds --io, --io-direct, --host-cache-mb, --io-qd, --io-rings, --io-threads, --coalesce-gap-kb,
// --max-read-kb, --direct-max-read-kb, --no-verify, --cache-aware, --cache-tolerance, --gpu, --gpu-cache-mb and
// --moe-lookahead to `app`.
void add_engine_options(CLI::App& app, EngineCliArgs& a);

// Sets the ModelOptions fields these flags own (checksums, cache-aware routing, GPU). Throws
// ConfigError at once (before any slow load) for GPU flags that cannot work: --gpu without a
// CUDA build or device, --gpu-cache-mb or --moe-lookahead without --gpu.
void apply_engine_options(const EngineCliArgs& a, ModelOptions& mo);

// Opens the expert store the flags describe; `tool` prefixes notices on stderr.
std::unique_ptr<ExpertStore> open_engine_store(const EngineCliArgs& a, const std::filesystem::path& dir,
                                               const ModelConfig& cfg, const char* tool);

}  // namespace moestream
