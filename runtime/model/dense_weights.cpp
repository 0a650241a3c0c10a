// Implementation of runtime/model/dense_weights.h: the tensor list of an architecture, and the CPU load
// that reads each tensor of dense.safetensors straight into its Eigen array, widened to float32.
#include "runtime/model/dense_weights.h"

#include <string>

#include "common/checked.h"
#include "common/error.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "loader/format/gguf_model.h"
#include "loader/format/safetensors.h"

namespace moestream {

size_t DenseTensorSpec::elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::vector<DenseTensorSpec> dense_tensor_specs(const ModelConfig& cfg) {
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size, hd = cfg.head_dim;
  const int64_t qd = int64_t{cfg.n_heads} * hd, kvd = int64_t{cfg.n_kv_heads} * hd;
  using K = DenseTensor;
  std::vector<DenseTensorSpec> s{{"embed", {V, D}, K::kEmbed}, {"final_norm", {D}, K::kFinalNorm}};
  if (!cfg.tie_word_embeddings) s.push_back({"lm_head", {V, D}, K::kLmHead});
  for (int i = 0; i < cfg.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    s.push_back({p + "attn_norm", {D}, K::kAttnNorm, i});
    s.push_back({p + "wq", {qd, D}, K::kWq, i});
    s.push_back({p + "wk", {kvd, D}, K::kWk, i});
    s.push_back({p + "wv", {kvd, D}, K::kWv, i});
    s.push_back({p + "wo", {D, qd}, K::kWo, i});
    if (cfg.qk_norm == QkNorm::kPerHead) {
      s.push_back({p + "q_norm", {hd}, K::kQNorm, i});
      s.push_back({p + "k_norm", {hd}, K::kKNorm, i});
    } else if (cfg.qk_norm == QkNorm::kFull) {
      s.push_back({p + "q_norm", {qd}, K::kQNorm, i});
      s.push_back({p + "k_norm", {kvd}, K::kKNorm, i});
    }
    s.push_back({p + "ffn_norm", {D}, K::kFfnNorm, i});
    s.push_back({p + "router", {cfg.n_experts, D}, K::kRouter, i});
  }
  return s;
}

size_t active_dense_bytes(const ModelConfig& cfg) {
  size_t n = size_t(cfg.hidden_size);  // the token's embedding row
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg))
    if (t.kind != DenseTensor::kEmbed || cfg.tie_word_embeddings) n += t.elements();
  return n * sizeof(float);
}

namespace {

// Llama's Q and K rows as llama.cpp's converter stores them: within each head, the two halves
// that rotate-half RoPE pairs (i, i + hd/2) are interleaved as (2i, 2i + 1). Undone so the engine's
// one RoPE applies: our row h*hd + half*hd/2 + i is the file's row h*hd + 2i + half.
void deinterleave_qk_rows(RowMatrix& m, int head_dim) {
  const Eigen::Index hd = head_dim, half = hd / 2;
  RowMatrix head(hd, m.cols());
  for (Eigen::Index h0 = 0; h0 + hd <= m.rows(); h0 += hd) {
    for (Eigen::Index i = 0; i < half; ++i) {
      head.row(i) = m.row(h0 + 2 * i);
      head.row(half + i) = m.row(h0 + 2 * i + 1);
    }
    m.middleRows(h0, hd) = head;
  }
}

// The dense weights of a GGUF, each tensor decoded to float32 from its stored type.
DenseWeights load_gguf(const std::filesystem::path& path, const ModelConfig& cfg) {
  const GgufModel g(path);
  DenseWeights w;
  w.layers.resize(static_cast<size_t>(cfg.n_layers));
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg)) {
    const GgufTensor& gt = g.dense_tensor(t.name);
    LayerWeights* l = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    const size_t rows = t.shape.size() == 2 ? size_t(t.shape[0]) : 1;
    const size_t cols = size_t(t.shape.back());
    float* dst = nullptr;
    const auto sized = [&](auto&& resize) {
      allocating("dense tensor '" + gt.name + "'", uint64_t(t.elements()) * sizeof(float), path.string(), resize);
    };
    auto matrix = [&](RowMatrix& m) { sized([&] { m.resize(Eigen::Index(rows), Eigen::Index(cols)); }); dst = m.data(); };
    auto vector = [&](Eigen::VectorXf& v) { sized([&] { v.resize(Eigen::Index(cols)); }); dst = v.data(); };
    switch (t.kind) {
      case DenseTensor::kEmbed: matrix(w.embed); break;
      case DenseTensor::kLmHead: matrix(w.lm_head); break;
      case DenseTensor::kFinalNorm: vector(w.final_norm); break;
      case DenseTensor::kAttnNorm: vector(l->attn_norm); break;
      case DenseTensor::kWq: matrix(l->wq); break;
      case DenseTensor::kWk: matrix(l->wk); break;
      case DenseTensor::kWv: matrix(l->wv); break;
      case DenseTensor::kWo: matrix(l->wo); break;
      case DenseTensor::kQNorm: vector(l->q_norm); break;
      case DenseTensor::kKNorm: vector(l->k_norm); break;
      case DenseTensor::kFfnNorm: vector(l->ffn_norm); break;
      case DenseTensor::kRouter: matrix(l->router); break;
    }
    if (!ggml_type_computable(gt.type))
      throw ConfigError(path.string() + ": tensor '" + gt.name + "' has type " + std::string(ggml_type_name(gt.type)) +
                        ", which this build cannot compute");
    const std::vector<uint8_t> bytes = g.read_tensor(gt);
    dequantize_matrix(ggml_quant(gt.type), bytes.data(), rows, cols, dst);
    if (g.qk_rows_interleaved() && (t.kind == DenseTensor::kWq || t.kind == DenseTensor::kWk))
      deinterleave_qk_rows(t.kind == DenseTensor::kWq ? l->wq : l->wk, cfg.head_dim);
  }
  return w;
}

}  // namespace

DenseWeights DenseWeights::load(const std::filesystem::path& path, const ModelConfig& cfg) {
  if (cfg.format == ModelFormat::kGguf) return load_gguf(path, cfg);
  SafetensorsFile f(path);
  DenseWeights w;
  w.layers.resize(static_cast<size_t>(cfg.n_layers));
  for (const DenseTensorSpec& t : dense_tensor_specs(cfg)) {
    f.check_shape(t.name, t.shape);
    LayerWeights* l = t.layer >= 0 ? &w.layers[size_t(t.layer)] : nullptr;
    float* dst = nullptr;
    // Sized by the file's model.json: a failure names the tensor and the file, not just bad_alloc.
    const auto sized = [&](auto&& resize) {
      allocating("dense tensor '" + t.name + "'", uint64_t(t.elements()) * sizeof(float), path.string(), resize);
    };
    auto matrix = [&](RowMatrix& m) { sized([&] { m.resize(t.shape[0], t.shape[1]); }); dst = m.data(); };
    auto vector = [&](Eigen::VectorXf& v) { sized([&] { v.resize(t.shape[0]); }); dst = v.data(); };
    switch (t.kind) {
      case DenseTensor::kEmbed: matrix(w.embed); break;
      case DenseTensor::kLmHead: matrix(w.lm_head); break;
      case DenseTensor::kFinalNorm: vector(w.final_norm); break;
      case DenseTensor::kAttnNorm: vector(l->attn_norm); break;
      case DenseTensor::kWq: matrix(l->wq); break;
      case DenseTensor::kWk: matrix(l->wk); break;
      case DenseTensor::kWv: matrix(l->wv); break;
      case DenseTensor::kWo: matrix(l->wo); break;
      case DenseTensor::kQNorm: vector(l->q_norm); break;
      case DenseTensor::kKNorm: vector(l->k_norm); break;
      case DenseTensor::kFfnNorm: vector(l->ffn_norm); break;
      case DenseTensor::kRouter: matrix(l->router); break;
    }
    f.read_float(t.name, 0, t.elements(), dst);
  }
  return w;
}

}  // namespace moestream
