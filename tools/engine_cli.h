// The engine options that `infer` and `moestream-server` share (expert reads, host cache,
// checksums, cache-aware routing): one definition of the flags, their help and their mapping.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/expert_store.h"
#include "runtime/model.h"

namespace moestream {

struct EngineCliArgs {
  std::string io = "auto";
  bool io_direct = false;
  uint64_t host_cache_mb = 0, coalesce_gap_kb = 64, max_read_kb = 1024;
  uint32_t io_qd = 32, io_rings = 0, io_threads = 0;  // 0 = the engine's default
  bool no_verify = false;
  bool cache_aware = false;
  float cache_tolerance = 0.10f;
};

// Adds --io, --io-direct, --host-cache-mb, --io-qd, --io-rings, --io-threads, --coalesce-gap-kb,
// --max-read-kb, --no-verify, --cache-aware and --cache-tolerance to `app`.
void add_engine_options(CLI::App& app, EngineCliArgs& a);

// Sets the ModelOptions fields these flags own (checksums, cache-aware routing).
void apply_engine_options(const EngineCliArgs& a, ModelOptions& mo);

// Opens the expert store the flags describe; `tool` prefixes notices on stderr.
std::unique_ptr<ExpertStore> open_engine_store(const EngineCliArgs& a, const std::filesystem::path& dir,
                                               const ModelConfig& cfg, const char* tool);

}  // namespace moestream
