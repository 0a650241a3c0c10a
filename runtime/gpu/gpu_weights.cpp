// Implementation of runtime/gpu/gpu_weights.h: checks and sizes every tensor first, allocates
// once, then streams each tensor from the file through one 64 MiB host buffer.
#include "runtime/gpu/gpu_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/model/dense_weights.h"
#include "loader/format/safetensors.h"

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

GpuDenseWeights GpuDenseWeights::load(const ModelConfig& cfg, const std::filesystem::path& path) {
  const SafetensorsFile f(path);
  const std::vector<DenseTensorSpec> specs = dense_tensor_specs(cfg);
  auto padded = [](size_t n) { return (n + 63) / 64 * 64; };  // 256-byte aligned tensors
  size_t total = 0;
  for (const DenseTensorSpec& t : specs) {
    f.check_shape(t.name, t.shape);  // every shape before the first byte moves
    total += padded(t.elements());
  }
  GpuDenseWeights g;
  g.memory = DeviceBuffer(total * sizeof(float));
  g.layers.resize(size_t(cfg.n_layers));
  constexpr size_t kPiece = size_t(16) << 20;  // floats per copy: 64 MiB of host memory
  std::vector<float> host(std::min(kPiece, total));
  float* dst = g.memory.as<float>();
  for (const DenseTensorSpec& t : specs) {
    const size_t n = t.elements();
    for (size_t first = 0; first < n; first += kPiece) {
      const size_t count = std::min(kPiece, n - first);
      f.read_float(t.name, first, count, host.data());
      MOE_CUDA_CHECK(cudaMemcpy(dst + first, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      f.release(t.name, first, count);  // the file's pages stay cached, not mapped by us
    }
    GpuLayerWeights* l = t.layer >= 0 ? &g.layers[size_t(t.layer)] : nullptr;
    const float*& slot = [&]() -> const float*& {
      switch (t.kind) {
        case DenseTensor::kEmbed: return g.embed;
        case DenseTensor::kLmHead: return g.lm_head;
        case DenseTensor::kFinalNorm: return g.final_norm;
        case DenseTensor::kAttnNorm: return l->attn_norm;
        case DenseTensor::kWq: return l->wq;
        case DenseTensor::kWk: return l->wk;
        case DenseTensor::kWv: return l->wv;
        case DenseTensor::kWo: return l->wo;
        case DenseTensor::kQNorm: return l->q_norm;
        case DenseTensor::kKNorm: return l->k_norm;
        case DenseTensor::kFfnNorm: return l->ffn_norm;
        case DenseTensor::kRouter: return l->router;
      }
      MOE_ASSERT(false, "unknown dense tensor kind");
      return g.embed;
    }();
    slot = dst;
    dst += padded(n);
  }
  if (g.lm_head == nullptr) g.lm_head = g.embed;  // tie_word_embeddings
  const bool qk = cfg.qk_norm != QkNorm::kNone;
  for (const GpuLayerWeights& d : g.layers)
    MOE_ASSERT(d.wq && d.wk && d.wv && d.wo && d.router && d.attn_norm && d.ffn_norm &&
               (!qk || (d.q_norm && d.k_norm)), "dense weights missing a tensor after load");
  return g;
}

}  // namespace moestream
