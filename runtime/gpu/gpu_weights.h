// Device memory for the GPU forward pass: an owning device buffer, and the dense weights of a
// model streamed once from dense.safetensors to the GPU as float32. Plain C++ header.
#pragma once

#include <cstddef>
#include <filesystem>
#include <utility>
#include <vector>

#include "loader/format/model_config.h"

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
  // Reads every tensor of runtime/model/dense_weights.h's list from `path` (shapes checked: FormatError
  // naming the tensor) and copies it to the device in 64 MiB pieces, synchronously, at load: the
  // host holds one piece at a time, never a float32 copy of the model.
  static GpuDenseWeights load(const ModelConfig& cfg, const std::filesystem::path& path);
};

}  // namespace moestream
