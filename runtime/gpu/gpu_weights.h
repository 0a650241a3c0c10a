// Memory for the GPU forward pass: owning device and pinned host buffers, and the dense weights
// of a model on the GPU in their stored precision (the matrices the CPU pass computes from,
// runtime/model/dense_weights.h). Plain C++ header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

#include "loader/format/expert_file.h"
#include "loader/format/model_config.h"

namespace moestream {

struct DenseWeights;

// One cudaMalloc, freed on destruction. Throws Error naming the size and the free memory when
// the allocation fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory (async copies need it to stay asynchronous); Error when it cannot be had.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

// A dense matrix on the device as stored: `rows` rows of `cols` elements in `type` (kF32, or a
// ggml type: a pack's bf16/f16 is ggml's BF16/F16), row r at data + r * row bytes.
struct GpuMatrix {
  QuantType type = QuantType::kF32;
  const uint8_t* data = nullptr;  // device, 256-byte aligned
  int rows = 0, cols = 0;
  const float* f32() const { return reinterpret_cast<const float*>(data); }  // type kF32 only
};

// Device pointers of one layer's dense tensors (q_norm/k_norm null without QK-norm). Norms and
// the router are float32, as on the CPU (routing decisions from exact logits).
struct GpuLayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  GpuMatrix wq, wk, wv, wo;
  const float *q_norm = nullptr, *k_norm = nullptr;
  const float* router = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // null without qkv_bias
  GpuMatrix shared_gate, shared_up, shared_down;            // empty without a shared expert
  const float* shared_expert_gate = nullptr;                // [1, D] float32, as the router
  // The router's bias [E] on the device (the router) and on the host (cache-aware substitution):
  // GLM-4.5 / DeepSeek-V3's sigmoid correction bias, or gpt-oss's logit bias (router_bias). A dense
  // first layer's MLP (GLM-4.5 / DeepSeek-V3; router null then).
  const float* router_bias_dev = nullptr;
  std::vector<float> router_bias;
  GpuMatrix mlp_gate, mlp_up, mlp_down;
  // gpt-oss (null otherwise): wo's bias [D], per-head sink logits [H].
  const float *bo = nullptr, *sinks = nullptr;
  // DeepSeek-V2/V3 MLA (empty / null otherwise; wk and wv are empty then, wq is the plain query
  // projection when q_lora_rank is 0): runtime/gpu/gpu_mla.h, docs/mla.md.
  GpuMatrix wq_a, wq_b, wkv_a, wkv_b;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
};

struct GpuDenseWeights {
  DeviceBuffer memory;  // every tensor, 256-byte aligned, in one allocation
  GpuMatrix embed;
  GpuMatrix lm_head;  // the embedding table when tied
  const float* final_norm = nullptr;
  std::vector<GpuLayerWeights> layers;

  size_t bytes() const { return memory.bytes(); }
  // Loads `path` as the CPU pass does (DenseWeights::load: dense.safetensors or the GGUF, every
  // tensor's shape and type checked, llama's Q/K rows de-interleaved) and uploads it.
  static GpuDenseWeights load(const ModelConfig& cfg, const std::filesystem::path& path);
  // Copies every tensor of `host` to the device in 64 MiB pieces, synchronously: matrices in
  // their stored bytes (the host holds no float32 copy of any), norms and routers as float32.
  // Pieces read from a file mapping are dropped from this process's mapping once copied.
  static GpuDenseWeights upload(const ModelConfig& cfg, const DenseWeights& host);
};

}  // namespace moestream
