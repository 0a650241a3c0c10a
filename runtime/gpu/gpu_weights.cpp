// Implementation of runtime/gpu/gpu_weights.h: sizes every tensor first, allocates once, copies.
#include "runtime/gpu/gpu_weights.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "common/error.h"
#include "kernels/cuda_check.cuh"

namespace moestream {

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state so later checks see their own
    p_ = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    char buf[160];
    std::snprintf(buf, sizeof buf, "GPU: cannot allocate %.1f MiB (%.1f MiB free of %.1f MiB): ",
                  double(bytes) / (1 << 20), double(free_b) / (1 << 20), double(total_b) / (1 << 20));
    throw Error(std::string(buf) + cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

GpuDenseWeights GpuDenseWeights::upload(const ModelConfig& cfg, const DenseWeights& w) {
  // Two passes over the same list: sizes, then copies into the carved allocation.
  struct Part {
    const float* host;
    size_t n;
    const float** dev;
  };
  GpuDenseWeights g;
  std::vector<Part> parts;
  auto add = [&parts](const float* p, size_t n, const float** dev) {
    if (n > 0) parts.push_back({p, n, dev});
  };
  add(w.embed.data(), size_t(w.embed.size()), &g.embed);
  if (w.lm_head.size() > 0) add(w.lm_head.data(), size_t(w.lm_head.size()), &g.lm_head);
  add(w.final_norm.data(), size_t(w.final_norm.size()), &g.final_norm);
  g.layers.resize(w.layers.size());
  MOE_ASSERT(int(w.layers.size()) == cfg.n_layers);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    GpuLayerWeights& d = g.layers[l];
    add(lw.attn_norm.data(), size_t(lw.attn_norm.size()), &d.attn_norm);
    add(lw.ffn_norm.data(), size_t(lw.ffn_norm.size()), &d.ffn_norm);
    add(lw.wq.data(), size_t(lw.wq.size()), &d.wq);
    add(lw.wk.data(), size_t(lw.wk.size()), &d.wk);
    add(lw.wv.data(), size_t(lw.wv.size()), &d.wv);
    add(lw.wo.data(), size_t(lw.wo.size()), &d.wo);
    add(lw.q_norm.data(), size_t(lw.q_norm.size()), &d.q_norm);
    add(lw.k_norm.data(), size_t(lw.k_norm.size()), &d.k_norm);
    add(lw.router.data(), size_t(lw.router.size()), &d.router);
  }
  auto padded = [](size_t n) { return (n + 63) / 64 * 64; };  // 256-byte aligned tensors
  size_t total = 0;
  for (const Part& p : parts) total += padded(p.n);
  g.memory = DeviceBuffer(total * sizeof(float));
  float* dst = g.memory.as<float>();
  for (const Part& p : parts) {
    MOE_CUDA_CHECK(cudaMemcpy(dst, p.host, p.n * sizeof(float), cudaMemcpyHostToDevice));
    *p.dev = dst;
    dst += padded(p.n);
  }
  if (g.lm_head == nullptr) g.lm_head = g.embed;  // tie_word_embeddings
  const bool qk = cfg.qk_norm != QkNorm::kNone;
  for (const GpuLayerWeights& d : g.layers)
    MOE_ASSERT(d.wq && d.wk && d.wv && d.wo && d.router && d.attn_norm && d.ffn_norm &&
               (!qk || (d.q_norm && d.k_norm)), "dense weights missing a tensor after load");
  return g;
}

}  // namespace moestream
