// Implementation of tools/engine_cli.h.
#include "tools/engine_cli.h"

#include <cstdio>
#include <memory>
#include <string>

#include "common/progress.h"
#include "loader/store/store_options.h"
#include "tools/cli_range.h"

namespace moestream {

void add_engine_options(CLI::App& app, EngineCliArgs& a) {
  app.add_flag("--no-verify,--no-verify-checksums", a.no_verify,
               "skip the per-expert checksum (by default an expert is verified when read from the "
               "device; its page-cache pages, once verified, are used unhashed while they stay "
               "resident and the file is unchanged)");
  app.add_option("--io", a.store.io,
                 "expert reads through the batch engine: auto (io_uring, else the pread pool with "
                 "a notice), uring, pread (thread pool), mmap (page-fault baseline); or simple "
                 "(one blocking pread per expert)")->capture_default_str();
  app.add_flag("--io-direct", a.store.io_direct,
               "read experts with O_DIRECT (bypass the page cache; buffered with a notice where "
               "the filesystem refuses)");
  app.add_option("--host-cache-mb", a.store.host_cache_mb,
                 "host expert cache in MiB (LFU with aging), for --io-direct; 0 = none")
      ->capture_default_str()->check(in_range(uint64_t(0), kMaxHostCacheMb));
  app.add_flag("--no-auto-direct", a.no_auto_direct,
               "keep the page cache for a model larger than memory (by default, with neither "
               "--io-direct nor --host-cache-mb given, a model whose files exceed the memory the "
               "process may fill, its cgroup's limit included, is read with O_DIRECT into a host "
               "cache of what the dense weights leave, at most half of it; a notice says so)");
  app.add_option("--io-qd", a.store.io_qd, "reads in flight per io_uring ring")->capture_default_str()
      ->check(in_range(1u, kMaxIoQueueDepth));
  app.add_option("--io-rings", a.store.io_rings, "io_uring rings, one thread each; 0 = one per core up to 8")
      ->capture_default_str()->check(in_range(0u, kMaxIoWorkers));
  app.add_option("--io-threads", a.store.io_threads, "pread/mmap worker threads; 0 = cores, 4..16")
      ->capture_default_str()->check(in_range(0u, kMaxIoWorkers));
  app.add_option("--coalesce-gap-kb", a.store.coalesce_gap_kb,
                 "merge reads of experts at most this far apart into one; 0 = no coalescing")
      ->capture_default_str()->check(in_range(uint64_t(0), kMaxCoalesceGapKb));
  app.add_option("--max-read-kb", a.store.max_read_kb,
                 "largest single read; longer experts are split to keep more reads in flight")
      ->capture_default_str()->check(in_range(kMinReadKb, kMaxReadKb));
  app.add_option("--direct-max-read-kb", a.store.direct_max_read_kb,
                 "largest single read with --io-direct (whole experts read faster from a device "
                 "than 1 MiB pieces)")
      ->capture_default_str()->check(in_range(kMinReadKb, kMaxReadKb));
  app.add_option("--io-profile", a.store.io_profile,
                 "device profile JSON (bench_io --profile-out): each batch then reads through a "
                 "gap when the profile says one read is cheaper than two, and O_DIRECT reads of "
                 "adjacent experts merge past --direct-max-read-kb; default: the fixed "
                 "--coalesce-gap-kb and read caps");
  app.add_flag("--cache-aware", a.cache_aware,
               "after the exact top-k, replace a selected expert that is not resident (GPU expert "
               "cache with --gpu, host cache or page cache) by the best resident unselected expert "
               "whose router LOGIT is within --cache-tolerance x (top-k logit range) of it, "
               "weakest slot first; weights are then renormalised as the model does");
  app.add_option("--cache-tolerance", a.cache_tolerance,
                 "tolerance of --cache-aware, as a fraction of the top-k logit range (top-1 logit "
                 "minus top-k logit); with top-k = 1 an absolute logit difference; 0 = no change")
      ->capture_default_str()->check(in_range(0.0f, kMaxCacheTolerance));
  app.add_flag("--cache-aware-union", a.cache_aware_union,
               "with --cache-aware, for batches of sequences (moestream-server --parallel N, infer "
               "--perplexity --parallel N): an expert an earlier sequence of the step chose (read once "
               "for all) counts as resident for the later ones' substitutions; sequences in the step's "
               "order (the server's: decode tokens by slot, then prompt chunks by slot); one sequence "
               "alone routes as without it; tolerance 0 changes nothing");
  app.add_flag("--gpu", a.gpu,
               "run the whole forward pass on the GPU (CUDA builds; an error, never a CPU "
               "fallback, without a GPU)");
  app.add_option("--gpu-cache-mb", a.gpu_cache_mb,
                 "GPU expert cache in MiB, with --gpu; 0 = the whole model's experts when they fit "
                 "in 80% of free VRAM, else 80% of free VRAM")
      ->capture_default_str()->check(in_range(uint64_t(0), kMaxGpuCacheMb));
  app.add_option("--moe-lookahead", a.moe_lookahead,
                 "during each decode step's layer L, apply layer L+1's router and read its N most "
                 "likely experts ahead: into the GPU cache with --gpu, else into the host cache "
                 "(--io-direct --host-cache-mb) or the page cache; at most n_experts; 0 = off "
                 "(never changes the output)")
      ->capture_default_str()->check(in_range(0, 1 << 16));
  app.add_flag("--gpu-sync-layers", a.gpu_sync_layers,
               "with --gpu: read every layer's routing on the host, also when the last decode "
               "step found all its experts in VRAM (by default such steps run with one sync per "
               "token); the same tokens, for comparison");
  app.add_flag("--gpu-preload", a.gpu_preload,
               "with --gpu: read every expert into the GPU cache before the first token, as an "
               "engine that keeps all weights in VRAM loads them at start (an error when the "
               "cache's budget cannot hold them all); by default the cache fills as experts are "
               "first used");
  app.add_flag("--gpu-no-graphs", a.gpu_no_graphs,
               "with --gpu: launch the kernels of a resident decode step one by one instead of "
               "as CUDA graphs (one per layer and one for lm_head); the same tokens, for "
               "comparison");
  app.add_flag("--gpu-pin-page-cache", a.gpu_pin_page_cache,
               "with --gpu: page-lock the model's files (they stay in RAM for the run; an error "
               "when they exceed the memory available, or with --io-direct) so the GPU copies a "
               "missed expert straight from the page cache, with no host copy");
  app.add_flag("--gpu-cpu-misses", a.gpu_cpu_misses,
               "with --gpu: compute the decode experts the GPU cache does not hold on the CPU "
               "(-t threads), where their pages lie, beside the GPU's hits; only their outputs "
               "cross PCIe and nothing is copied into VRAM for them");
}

void apply_engine_options(const EngineCliArgs& a, ModelOptions& mo) {
  mo.verify_checksums = !a.no_verify;
  mo.cache_aware.enabled = a.cache_aware;
  mo.cache_aware.tolerance = a.cache_tolerance;
  if (a.cache_aware_union && !a.cache_aware)
    throw ConfigError("--cache-aware-union is a rule of cache-aware routing: add --cache-aware (and --cache-tolerance)");
  mo.cache_aware.batch_union = a.cache_aware_union;
  mo.gpu = a.gpu;
  mo.gpu_cache_mb = size_t(a.gpu_cache_mb);
  mo.moe_lookahead = a.moe_lookahead;
  mo.gpu_sync_layers = a.gpu_sync_layers;
  mo.gpu_preload = a.gpu_preload;
  mo.gpu_no_graphs = a.gpu_no_graphs;
  mo.gpu_pin_page_cache = a.gpu_pin_page_cache;
  mo.gpu_cpu_misses = a.gpu_cpu_misses;
  if (a.gpu_preload) {
    auto progress = std::make_shared<Progress>("gpu-preload", true);
    mo.on_gpu_preload = [progress](int done, int total) {
      progress->update(uint64_t(done), uint64_t(total), "MoE layers in the GPU cache");
    };
  }
  check_gpu_options(mo);  // before the store opens and the weights load
}

std::unique_ptr<ExpertStore> open_engine_store(const EngineCliArgs& a, const ModelOptions& mo,
                                               const std::filesystem::path& dir, const ModelConfig& cfg,
                                               const char* tool) {
  StoreConfig c = a.store;
  c.auto_direct = !a.no_auto_direct;
  const std::string prefix = tool;
  return open_store_for(dir, cfg, store_config_for(mo, c), OptionSpelling::kCli, [prefix](const std::string& line) {
    std::fprintf(stderr, "%s: %s\n", prefix.c_str(), line.c_str());
  });
}

}  // namespace moestream
