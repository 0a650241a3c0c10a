// Implementation of loader/store/store_options.h.
#include "loader/store/store_options.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>

#include "common/checked.h"
#include "common/error.h"
#include "common/option_ref.h"
#include "loader/format/gguf_file.h"

namespace moestream {
namespace {

// Options are named with marks (common/option_ref.h), spelled by the front end.
std::string name(std::string_view field) { return option_ref(field); }

template <class T>
void check_field(std::string_view field, T value, T lo, T hi) {
  check_range(name(field), value, lo, hi);
}

// The model's bytes on disk: its experts' payloads (every MoE layer) and the rest (dense weights
// and headers: a pack's dense file; a GGUF's files less its experts). Unreadable sizes count 0.
struct ModelBytes {
  uint64_t experts = 0, dense = 0;
};

ModelBytes model_bytes(const std::filesystem::path& model, const ModelConfig& cfg) {
  ModelBytes b;
  for (int l = 0; l < cfg.n_moe_layers(); ++l)
    b.experts += uint64_t(cfg.expert_layout(l).bytes) * uint64_t(cfg.n_experts);
  const auto size = [](const std::filesystem::path& p) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(p, ec);
    return ec ? uint64_t(0) : uint64_t(n);
  };
  if (cfg.format == ModelFormat::kGguf) {
    uint64_t total = 0;
    if (const auto split = parse_gguf_split_name(model))
      for (uint32_t k = 1; k <= split->count; ++k) total += size(gguf_split_path(split->prefix, k, split->count));
    else
      total = size(model);
    b.dense = total > b.experts ? total - b.experts : 0;
  } else {
    b.dense = size(model / cfg.dense_file);
  }
  return b;
}

}  // namespace

EngineExpertStoreOptions build_store_options(const StoreConfig& c, const StoreNoticeFn& notice) {
  const bool simple = c.io == "simple";
  if (!simple && c.io != "auto" && c.io != "uring" && c.io != "pread" && c.io != "mmap")
    throw ConfigError("unknown " + name("io") + " value '" + c.io +
                      "' (expected simple, auto, uring, pread or mmap)");
  check_field("io_qd", c.io_qd, 1u, kMaxIoQueueDepth);
  check_field("io_rings", c.io_rings, 0u, kMaxIoWorkers);
  check_field("io_threads", c.io_threads, 0u, kMaxIoWorkers);
  check_field("max_read_kb", c.max_read_kb, kMinReadKb, kMaxReadKb);
  check_field("direct_max_read_kb", c.direct_max_read_kb, kMinReadKb, kMaxReadKb);
  check_field("coalesce_gap_kb", c.coalesce_gap_kb, uint64_t(0), kMaxCoalesceGapKb);
  check_field("host_cache_mb", c.host_cache_mb, uint64_t(0), kMaxHostCacheMb);

  // The engine's notices and ours take one path, so a front end sees them all the same way.
  auto say = [&](const std::string& line) {
    if (notice)
      notice(line);
    else
      std::fprintf(stderr, "moestream: %s\n", render_option_refs_as_flags(line).c_str());  // no front end: flags
  };
  if (simple && (c.io_direct || c.host_cache_mb > 0))
    say(option_ref("io", "simple") + " reads through the page cache: " + name("io_direct") + " and " +
        name("host_cache_mb") + " do not apply");
  else if (c.host_cache_mb > 0 && !c.io_direct)
    say(name("host_cache_mb") + " without " + name("io_direct") +
        ": experts are cached twice (host cache and page cache)");

  EngineExpertStoreOptions so;
  so.store.verify_checksums = c.verify_checksums;
  so.io.direct = c.io_direct;
  so.io.queue_depth = c.io_qd;
  so.io.n_rings = c.io_rings;
  so.io.n_threads = c.io_threads;
  so.io.coalesce = c.coalesce_gap_kb > 0;
  so.io.coalesce_gap_bytes = kib_to_bytes(c.coalesce_gap_kb, name("coalesce_gap_kb"));
  so.io.max_read_bytes = kib_to_bytes(c.max_read_kb, name("max_read_kb"));
  so.io.direct_max_read_bytes = kib_to_bytes(c.direct_max_read_kb, name("direct_max_read_kb"));
  if (!c.io_profile.empty()) {
    if (simple) say(option_ref("io", "simple") + " reads one expert at a time: " + name("io_profile") + " does not apply");
    else if (c.coalesce_gap_kb == 0)
      say(option_ref("coalesce_gap_kb", "0") + " turns merging off: " + name("io_profile") + " does not apply");
    so.io.profile = load_io_profile(c.io_profile);
  }
  so.io.notice = notice;  // empty: the engine's own "moestream: <line>" on stderr
  so.host_cache_bytes = mib_to_bytes(c.host_cache_mb, name("host_cache_mb"));
  return so;
}

uint64_t fit_reserve_bytes(uint64_t room_bytes) { return std::max(uint64_t(384) << 20, room_bytes / 8); }

StoreConfig fit_to_memory(const std::filesystem::path& model, const ModelConfig& cfg, StoreConfig c,
                          const std::optional<MemoryRoom>& room, const StoreNoticeFn& notice) {
  if (!c.auto_direct || c.io_direct || c.host_cache_mb > 0 || !room) return c;
  if (c.io != "auto" && c.io != "uring" && c.io != "pread") return c;
  // Experts on tmpfs are memory already, outside MemAvailable (so they would never seem to fit):
  // in place they cost nothing more; O_DIRECT into a host cache would copy memory into memory.
  if (on_memory_filesystem(cfg.format == ModelFormat::kGguf ? model : model / cfg.experts_dir)) return c;
  const ModelBytes b = model_bytes(model, cfg);
  if (b.experts + b.dense <= room->bytes) return c;
  // The host cache takes what the dense weights and the reserve leave, at most half the room:
  // where the room is the machine's MemAvailable, the rest of the machine keeps its page cache.
  const uint64_t held = b.dense + fit_reserve_bytes(room->bytes);
  const uint64_t cache = std::min(room->bytes > held ? room->bytes - held : 0, room->bytes / 2);
  c.io_direct = true;
  c.host_cache_mb = std::min(cache >> 20, kMaxHostCacheMb);
  const std::string line =
      "the model's files (" + gib_text(b.experts + b.dense) + ": experts " + gib_text(b.experts) + ", the rest " + gib_text(b.dense) +
      ") exceed the memory this process may fill (" + gib_text(room->bytes) + ", " + room->source +
      "): experts are read with O_DIRECT into a host cache of " + std::to_string(c.host_cache_mb) + " MiB (as " +
      option_ref("io_direct", "true") + " " + option_ref("host_cache_mb", std::to_string(c.host_cache_mb)) + "); " +
      option_ref("auto_direct", "false") + " keeps the page cache";
  if (notice)
    notice(line);
  else
    std::fprintf(stderr, "moestream: %s\n", render_option_refs_as_flags(line).c_str());  // no front end: flags
  return c;
}

std::unique_ptr<ExpertStore> open_store_for(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                            const StoreConfig& given, const StoreNoticeFn& notice) {
  const StoreConfig c = fit_to_memory(model_dir, cfg, given, memory_room(), notice);
  const EngineExpertStoreOptions so = build_store_options(c, notice);
  const std::string source = option_ref("host_cache_mb", std::to_string(c.host_cache_mb)) +
                             " and the expert sizes of " + (model_dir / "model.json").string();
  return allocating("the expert store's buffers and host cache", so.host_cache_bytes, source,
                    [&] { return open_expert_store(c.io, model_dir, cfg, so); });
}

// Declared in engine_expert_store.h (the store picked by the io option's name).
std::unique_ptr<ExpertStore> open_expert_store(std::string_view io,
                                               const std::filesystem::path& model_dir,
                                               const ModelConfig& cfg,
                                               EngineExpertStoreOptions opts) {
  if (io == "simple") {
    if (cfg.format == ModelFormat::kGguf)
      throw ConfigError(option_ref("io", "simple") + " reads packed models only; a GGUF is read by the engine (" +
                        option_ref("io") + " auto, uring, pread or mmap)");
    return open_pread_expert_store(model_dir, cfg, opts.store);
  }
  IoBackend b;
  try {
    b = parse_io_backend(io);
  } catch (const ConfigError&) {
    throw ConfigError("unknown " + option_ref("io") + " value '" + std::string(io) +
                      "' (expected simple, auto, uring, pread or mmap)");
  }
  opts.io.backend = b;
  return open_engine_expert_store(model_dir, cfg, opts);
}

}  // namespace moestream
