// The dense (non-expert) weights of a packed model held in RAM as float32 Eigen matrices:
// embeddings, norms, attention projections, routers, lm_head (names in loader/format/model_config.h).
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/format/model_config.h"

namespace moestream {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct LayerWeights {
  Eigen::VectorXf attn_norm, ffn_norm;
  RowMatrix wq, wk, wv, wo;        // [out, in]
  Eigen::VectorXf q_norm, k_norm;  // empty when the architecture has no QK-norm
  RowMatrix router;                // [n_experts, hidden]
};

// Which field of DenseWeights / LayerWeights a dense tensor fills.
enum class DenseTensor { kEmbed, kLmHead, kFinalNorm, kAttnNorm, kWq, kWk, kWv, kWo, kQNorm, kKNorm, kFfnNorm, kRouter };

// One dense tensor a model calls for: its name in dense.safetensors, its shape, its field.
struct DenseTensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // [rows, cols] for matrices, [n] for vectors
  DenseTensor kind;
  int layer = -1;  // -1 for the model-level tensors
  size_t elements() const;
};

// Every dense tensor of cfg's architecture: embed, lm_head (unless tied), final_norm, then each
// layer's. The one list both the CPU load and the GPU upload read.
std::vector<DenseTensorSpec> dense_tensor_specs(const ModelConfig& cfg);

// float32 bytes of dense weights one token reads: all of them but the embedding, of which one
// row (plus the whole table when it doubles as lm_head).
size_t active_dense_bytes(const ModelConfig& cfg);

struct DenseWeights {
  RowMatrix embed;    // [vocab, hidden]
  RowMatrix lm_head;  // [vocab, hidden]; empty when tied to embed
  Eigen::VectorXf final_norm;
  std::vector<LayerWeights> layers;

  const RowMatrix& output() const { return lm_head.size() ? lm_head : embed; }
  // Loads `path` (dense.safetensors) and checks every tensor's presence and shape against cfg;
  // FormatError names the file, the tensor, the expected and actual shape.
  static DenseWeights load(const std::filesystem::path& path, const ModelConfig& cfg);
};

}  // namespace moestream
