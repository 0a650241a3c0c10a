// Implementation of loader/store/store_options.h.
#include "loader/store/store_options.h"

#include <cstdio>
#include <string>

#include "common/checked.h"
#include "common/error.h"

namespace moestream {
namespace {

struct Namer {
  OptionSpelling spelling;
  std::string operator()(std::string_view field) const { return store_option_name(field, spelling); }
};

template <class T>
void check_range(const Namer& name, std::string_view field, T value, T lo, T hi) {
  moestream::check_range(name(field), value, lo, hi);
}

}  // namespace

std::string store_option_name(std::string_view field, OptionSpelling spelling) {
  std::string s(field);
  if (spelling == OptionSpelling::kPython) return s;
  for (char& ch : s)
    if (ch == '_') ch = '-';
  return "--" + s;
}

EngineExpertStoreOptions build_store_options(const StoreConfig& c, OptionSpelling spelling,
                                             const StoreNoticeFn& notice) {
  const Namer name{spelling};
  const bool simple = c.io == "simple";
  if (!simple && c.io != "auto" && c.io != "uring" && c.io != "pread" && c.io != "mmap")
    throw ConfigError("unknown " + name("io") + " value '" + c.io +
                      "' (expected simple, auto, uring, pread or mmap)");
  check_range(name, "io_qd", c.io_qd, 1u, kMaxIoQueueDepth);
  check_range(name, "io_rings", c.io_rings, 0u, kMaxIoWorkers);
  check_range(name, "io_threads", c.io_threads, 0u, kMaxIoWorkers);
  check_range(name, "max_read_kb", c.max_read_kb, kMinReadKb, kMaxReadKb);
  check_range(name, "direct_max_read_kb", c.direct_max_read_kb, kMinReadKb, kMaxReadKb);
  check_range(name, "coalesce_gap_kb", c.coalesce_gap_kb, uint64_t(0), kMaxCoalesceGapKb);
  check_range(name, "host_cache_mb", c.host_cache_mb, uint64_t(0), kMaxHostCacheMb);

  // The engine's notices and ours take one path, so a front end sees them all the same way.
  auto say = [&](const std::string& line) {
    if (notice)
      notice(line);
    else
      std::fprintf(stderr, "moestream: %s\n", line.c_str());
  };
  if (simple && (c.io_direct || c.host_cache_mb > 0))
    say(name("io") + " simple reads through the page cache: " + name("io_direct") + " and " +
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
    if (simple) say(name("io") + " simple reads one expert at a time: " + name("io_profile") + " does not apply");
    else if (c.coalesce_gap_kb == 0)
      say(name("coalesce_gap_kb") + " 0 turns merging off: " + name("io_profile") + " does not apply");
    so.io.profile = load_io_profile(c.io_profile);
  }
  so.io.notice = notice;  // empty: the engine's own "moestream: <line>" on stderr
  so.host_cache_bytes = mib_to_bytes(c.host_cache_mb, name("host_cache_mb"));
  return so;
}

std::unique_ptr<ExpertStore> open_store_for(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                            const StoreConfig& c, OptionSpelling spelling,
                                            const StoreNoticeFn& notice) {
  const EngineExpertStoreOptions so = build_store_options(c, spelling, notice);
  const std::string source = store_option_name("host_cache_mb", spelling) + " " + std::to_string(c.host_cache_mb) +
                             " and the expert sizes of " + (model_dir / "model.json").string();
  return allocating("the expert store's buffers and host cache", so.host_cache_bytes, source,
                    [&] { return open_expert_store(c.io, model_dir, cfg, so); });
}

// Declared in engine_expert_store.h (the store picked by an --io name).
std::unique_ptr<ExpertStore> open_expert_store(std::string_view io,
                                               const std::filesystem::path& model_dir,
                                               const ModelConfig& cfg,
                                               EngineExpertStoreOptions opts) {
  if (io == "simple") {
    if (cfg.format == ModelFormat::kGguf)
      throw ConfigError("--io simple reads packed models only; a GGUF is read by the engine (--io auto, uring, "
                        "pread or mmap)");
    return open_pread_expert_store(model_dir, cfg, opts.store);
  }
  IoBackend b;
  try {
    b = parse_io_backend(io);
  } catch (const ConfigError&) {
    throw ConfigError("unknown --io value '" + std::string(io) +
                      "' (expected simple, auto, uring, pread or mmap)");
  }
  opts.io.backend = b;
  return open_engine_expert_store(model_dir, cfg, opts);
}

}  // namespace moestream
