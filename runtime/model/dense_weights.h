// The dense (non-expert) weights of a model for the CPU pass: embeddings, norms, attention
// projections, routers, lm_head (names in loader/format/model_config.h). The matrices stay in
// their stored type (bf16 or f32 of a pack's dense.safetensors, a ggml type of its dense.gguf or
// of a GGUF tensor) and
// are computed from it; their bytes are a read-only shared mapping of the file, except where a
// transformation is needed (llama's Q/K row order), which gets an owned copy in the same type.
// Norm vectors and routers are small and held as float32 (routing decisions from exact logits).
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "loader/format/expert_file.h"
#include "loader/format/model_config.h"

namespace moestream {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A matrix as stored: `rows` rows of `cols` elements, row r at data + r * row_bytes(), each row
// self-contained (a ggml block row). type is kF32 or a ggml type (ggml_quant(); a pack's bf16 is
// ggml's BF16, the same encoding). data points into DenseWeights' storage.
struct DenseMatrix {
  QuantType type = QuantType::kF32;
  size_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;

  size_t row_bytes() const { return quant_matrix_bytes(type, 1, cols); }
  size_t bytes() const { return quant_matrix_bytes(type, rows, cols); }
  bool empty() const { return rows == 0; }
  // Row r decoded to cols floats (the embedding lookup).
  void decode_row(size_t r, float* dst) const;
};

struct LayerWeights {
  Eigen::VectorXf attn_norm, ffn_norm;
  DenseMatrix wq, wk, wv, wo;      // [out, in]
  Eigen::VectorXf q_norm, k_norm;  // empty when the architecture has no QK-norm
  RowMatrix router;                // [n_experts, hidden]
  Eigen::VectorXf bq, bk, bv;      // empty without qkv_bias
  // The shared expert (empty without one): SwiGLU matrices in their stored type, and its gate
  // [1, hidden] in float32 as the router.
  DenseMatrix shared_gate, shared_up, shared_down;
  RowMatrix shared_expert_gate;      // empty when the shared expert is ungated (GLM-4.5)
  // The router's bias [n_experts] (empty otherwise): GLM-4.5 / DeepSeek-V3's sigmoid correction
  // bias (selection only), or gpt-oss's bias added to the logits (router_bias).
  Eigen::VectorXf router_bias;
  // GLM-4.5 / DeepSeek-V3: the dense SwiGLU MLP of a layer below first_k_dense_replace (router
  // empty then).
  DenseMatrix mlp_gate, mlp_up, mlp_down;
  // DeepSeek-V3 MLA (empty otherwise; wq is the plain query projection when q_lora_rank is 0).
  DenseMatrix wq_a, wq_b, wkv_a, wkv_b;
  Eigen::VectorXf q_a_norm, kv_a_norm;
  // gpt-oss (empty otherwise): the output projection's bias [D], the per-head sink logits [H].
  Eigen::VectorXf bo, sinks;
};

// Which field of DenseWeights / LayerWeights a dense tensor fills.
enum class DenseTensor {
  kEmbed, kLmHead, kFinalNorm, kAttnNorm, kWq, kWk, kWv, kWo, kQNorm, kKNorm, kFfnNorm, kRouter,
  kBq, kBk, kBv, kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate,
  kRouterBias, kMlpGate, kMlpUp, kMlpDown,  // GLM-4.5 / DeepSeek-V3 (kRouterBias: gpt-oss too)
  kBo, kSinks,                              // gpt-oss
  kWqA, kWqB, kWkvA, kWkvB, kQANorm, kKvANorm,  // DeepSeek-V3 MLA
};

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

// Bytes of dense weights one token reads: all of them but the embedding, of which one row (plus
// the whole table when it doubles as lm_head). Each matrix counts as stored in `dense_path`
// (dense.safetensors or the GGUF), the type both passes compute it in; norms and routers as
// float32.
size_t active_dense_bytes(const ModelConfig& cfg, const std::filesystem::path& dense_path);

struct DenseWeights {
  DenseMatrix embed;    // [vocab, hidden]
  DenseMatrix lm_head;  // [vocab, hidden]; empty when tied to embed
  Eigen::VectorXf final_norm;
  std::vector<LayerWeights> layers;

  const DenseMatrix& output() const { return lm_head.empty() ? embed : lm_head; }
  // Loads `path` (dense.safetensors; a pack's dense.gguf when cfg.dense_dtype is "gguf", tensors
  // by our names; the GGUF when cfg.format is kGguf) and checks every
  // tensor's presence, shape and type against cfg; FormatError names the file, the tensor, the
  // expected and actual shape; ConfigError a type this build cannot compute.
  static DenseWeights load(const std::filesystem::path& path, const ModelConfig& cfg);

  // Where the matrices' bytes live: the mapped files, and owned copies of transformed tensors.
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<std::unique_ptr<uint8_t[]>> owned;
};

}  // namespace moestream
