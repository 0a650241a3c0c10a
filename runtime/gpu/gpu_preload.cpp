// --gpu-preload (docs/gpu.md "Preloading every expert"): the whole model's experts read into the
// GPU expert cache before the first token, for a model whose experts fit in VRAM. Without it the
// cache fills on demand, so the first tokens after a short prompt read experts (and run synced)
// that an engine which loads every weight at start has in place already.
#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_cache_common.h"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

namespace {
// Experts per acquire(): the bound the forward pass uses (its scratch and staging are sized for it).
constexpr int kPreloadPerAcquire = 16;
}  // namespace

void CudaForward::preload_experts() {
  const int M = cfg.n_moe_layers();
  size_t need = 0;
  for (const ExpertLayout& lay : layouts) need += size_t(E) * gpu_slot_bytes(lay.bytes);
  if (need > info_.cache_bytes)
    throw ConfigError(option_ref("gpu_preload") + ": the model's experts need " + std::to_string(need >> 20) +
                      " MiB of GPU cache, the budget is " + std::to_string(info_.cache_bytes >> 20) +
                      " MiB (" + info_.cache_rule + "); raise " + option_ref("gpu_cache_mb") + " or drop " + option_ref("gpu_preload"));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> ids(static_cast<size_t>(E));
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<const uint8_t*> ptrs(static_cast<size_t>(kPreloadPerAcquire));
  for (int m = 0; m < M; ++m) {
    for (int e0 = 0; e0 < E; e0 += kPreloadPerAcquire) {
      const size_t n = size_t(std::min(E - e0, kPreloadPerAcquire));
      // kPrefill places into free budget and never evicts: nothing preloaded is pushed out.
      cache->acquire(m, std::span<const int>(ids.data() + e0, n), CacheFill::kPrefill,
                     std::span<const uint8_t*>(ptrs.data(), n));
      cache->kernels_enqueued();  // no kernels read them: the slots need no pin
    }
    if (opts.on_preload) opts.on_preload(m + 1, M);
  }
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The budget holds them all (checked above), so each must be in place; anything else is a bug
  // in the cache's placement, not a state to run on silently.
  int absent = 0;
  for (int m = 0; m < M; ++m)
    for (int e = 0; e < E; ++e) absent += cache->resident_payload(m, e) == nullptr;
  if (absent > 0)
    throw Error(option_ref("gpu_preload") + ": " + std::to_string(absent) + " of " + std::to_string(M * E) +
                " experts did not stay in the GPU cache after the preload");
  const GpuCacheTelemetry t = cache->telemetry();
  info_.preload_experts = uint64_t(M) * uint64_t(E);
  info_.preload_bytes = t.h2d_bytes;
  info_.preload_s = seconds_since(t0);
  // The run's cache counters start after the preload (its reads stay in the store's totals).
  cache->reset_telemetry();
  table_stale = true;
}

}  // namespace moestream::detail
