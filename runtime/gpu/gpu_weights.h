// Device memory for the GPU forward pass: an owning device buffer, and the dense weights of a
// model uploaded once as float32 (the layout of runtime/dense_weights.h). Plain C++ header.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "runtime/dense_weights.h"
#include "runtime/model_config.h"

namespace moestream {

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

// Device pointers of one layer's dense tensors (q_norm/k_norm null without QK-norm).
struct GpuLayerWeights {
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  const float* router = nullptr;
};

struct GpuDenseWeights {
  DeviceBuffer memory;  // every tensor, 256-byte aligned, in one allocation
  const float* embed = nullptr;
  const float* lm_head = nullptr;  // the embedding table when tied
  const float* final_norm = nullptr;
  std::vector<GpuLayerWeights> layers;

  size_t bytes() const { return memory.bytes(); }
  // Copies every tensor of `w` to the device (synchronously: once, at load).
  static GpuDenseWeights upload(const ModelConfig& cfg, const DenseWeights& w);
};

}  // namespace moestream
