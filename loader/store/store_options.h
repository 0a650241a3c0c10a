// The user-facing expert-store options (infer's --io flags, Python's Model keywords) and the one
// builder that validates them, emits their warnings and opens the store they describe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/memory_room.h"
#include "loader/format/model_config.h"
#include "loader/store/engine_expert_store.h"
#include "loader/store/expert_store.h"

namespace moestream {

// Field names are the options' names (runtime/engine/options.h); messages name them with marks
// (common/option_ref.h) that each front end spells its own way.
struct StoreConfig {
  std::string io = "auto";      // simple | auto | uring | pread | mmap (see open_expert_store)
  bool io_direct = false;       // O_DIRECT reads
  uint64_t host_cache_mb = 0;   // the store's host expert cache; 0 = none
  uint32_t io_qd = 32;          // reads in flight per io_uring ring
  uint32_t io_rings = 0;        // 0 = the engine's default (one per core up to 8)
  uint32_t io_threads = 0;      // pread/mmap workers; 0 = the engine's default (cores, 4..16)
  uint64_t coalesce_gap_kb = 64;  // 0 = no coalescing
  uint64_t max_read_kb = 1024;
  uint64_t direct_max_read_kb = 4096;  // read cap of O_DIRECT files (whole experts read faster)
  // A device profile file (bench_io --profile-out, loader/io/io_profile.h): the engine then
  // decides per batch which gaps to read through (io::MergeRule). Empty: the fixed gap and caps.
  std::string io_profile;
  bool verify_checksums = true;
  // Models larger than memory (docs/io_engine.md): with neither io_direct nor a host cache asked
  // for and io auto, uring or pread, a model whose files exceed the memory this process may fill
  // (common/memory_room.h: MemAvailable, a cgroup's limit) is read with O_DIRECT into a host cache
  // of what is left beside its dense weights, and a notice says so. false:
  // the page cache, whatever the model's size.
  bool auto_direct = true;
};

// Limits the builder enforces; the option table gives them to the front ends too.
inline constexpr uint32_t kMaxIoQueueDepth = 4096;
inline constexpr uint32_t kMaxIoWorkers = 1024;  // io_rings and io_threads: one thread each
inline constexpr uint64_t kMinReadKb = 4;        // one O_DIRECT block
inline constexpr uint64_t kMaxReadKb = uint64_t(1) << 30;
inline constexpr uint64_t kMaxCoalesceGapKb = uint64_t(1) << 30;
inline constexpr uint64_t kMaxHostCacheMb = uint64_t(1) << 40;

// Receives one-line warnings and notices: the builder's own (double caching, options that do not
// apply) and the read engine's (fallbacks such as io_uring unavailable or O_DIRECT refused), the
// latter possibly from I/O threads after the store is open, so it must be thread-safe.
// Empty: "moestream: <line>" on stderr.
using StoreNoticeFn = std::function<void(const std::string& line)>;

// Validates `c` (ConfigError naming the option, its value and the allowed range), sends the
// builder's warnings to `notice` and maps `c` to the engine store's options (backend left to
// open_expert_store, which parses c.io).
EngineExpertStoreOptions build_store_options(const StoreConfig& c, const StoreNoticeFn& notice = {});

// StoreConfig::auto_direct's rule for the model at `model` (a pack directory or a GGUF), given the
// memory room (nullopt: unknown, nothing changes): `c` as it is, or with io_direct on and
// host_cache_mb set, the choice sent to `notice` in one line naming the sizes and what bounds them.
StoreConfig fit_to_memory(const std::filesystem::path& model, const ModelConfig& cfg, StoreConfig c,
                          const std::optional<MemoryRoom>& room, const StoreNoticeFn& notice = {});
// What fit_to_memory keeps free beside the dense weights and the host cache: the KV cache,
// activations, the read buffers and the allocator's slack (384 MiB, or 1/8 of the room if more).
uint64_t fit_reserve_bytes(uint64_t room_bytes);

// fit_to_memory (with memory_room()), build_store_options, then open_expert_store(c.io, ...).
std::unique_ptr<ExpertStore> open_store_for(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                            const StoreConfig& c, const StoreNoticeFn& notice = {});

}  // namespace moestream
