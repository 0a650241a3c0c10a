// --gpu-cpu-misses (docs/gpu.md, "Misses on the CPU"): in a decode step, the experts the VRAM cache
// does not hold are computed on the host from their matrices where the store has them (in place in
// the page cache, verified on first use; else read into its buffers), by ExpertCompute on the
// model's thread pool, while the GPU computes the hits. Only the outputs, D floats an expert, cross
// PCIe; nothing is placed in VRAM for them. llama.cpp's `-ot exps=CPU` computes every expert that
// way; here the GPU keeps what its cache holds.
#include <chrono>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_forward_impl.h"

namespace moestream::detail {

void CudaForward::init_cpu_misses() {
  if (!opts.cpu_misses) return;
  if (opts.cpu_pool == nullptr) throw ConfigError("--gpu-cpu-misses: no CPU thread pool was given to the GPU pass");
  if (N > 0)
    throw ConfigError("--gpu-cpu-misses with --moe-lookahead: the look-ahead copies predicted experts into VRAM, "
                      "which this mode never does for a miss; use one");
  cpu_experts = std::make_unique<ExpertCompute>(cfg, K);
  h_host = PinnedBuffer(size_t(D) * sizeof(float));
  y_host = PinnedBuffer(size_t(K) * size_t(D) * sizeof(float));
  miss_payloads.reserve(size_t(K));
  miss_ready.reserve(size_t(K));
  miss_tokens.assign(size_t(K), 0);  // one token: every pair reads row 0 of h_host
}

void CudaForward::cpu_misses(int layer, int g0, int g1, int y_row0, ForwardTimes& times) {
  const int n = g1 - g0;
  if (n <= 0) return;
  MOE_ASSERT(n <= K, "cpu_misses: more experts than top-k in a decode step");
  const ExpertLayout& lay = layouts[size_t(layer)];
  auto ti = std::chrono::steady_clock::now();
  store.begin_fetch(layer, std::span<const int>(unique_ids.data() + g0, size_t(n)), FetchForm::kMatrices);
  times.expert_io_s += seconds_since(ti);
  const float* row = h_host.as<float>();
  float* out = y_host.as<float>();  // row i: the i-th missed expert's output
  cpu_experts->set_token(lay, row);
  miss_payloads.assign(size_t(n), ExpertMatrices{});
  // As the CPU pass: each batch of experts that has landed is computed while the rest load.
  for (int got = 0; got < n;) {
    ti = std::chrono::steady_clock::now();
    store.take_ready(miss_payloads, miss_ready);
    got += int(miss_ready.size());
    times.expert_io_s += seconds_since(ti);
    const auto tc = std::chrono::steady_clock::now();
    const std::span<const int> tokens(miss_tokens.data(), miss_ready.size());
    cpu_experts->run(*opts.cpu_pool, lay, ExpertPairs{miss_payloads, miss_ready, tokens, miss_ready}, row, true, out);
    times.expert_compute_s += seconds_since(tc);
  }
  // Group g0 + i holds row y_row0 + i (one row each); the combine reads y after this copy.
  MOE_CUDA_CHECK(cudaMemcpyAsync(y + size_t(y_row0) * D, out, size_t(n) * D * sizeof(float), cudaMemcpyHostToDevice,
                                 stream));
  cpu_miss_stats.experts += uint64_t(n);
  ++cpu_miss_stats.layers;
}

}  // namespace moestream::detail
