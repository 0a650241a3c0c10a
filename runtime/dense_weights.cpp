// Implementation of runtime/dense_weights.h: reads each tensor of dense.safetensors straight
// into its Eigen matrix, widening bf16/f16 to float32.
#include "runtime/dense_weights.h"

#include <string>

#include "common/error.h"
#include "runtime/safetensors.h"

namespace moestream {

namespace {

RowMatrix read_matrix(const SafetensorsFile& f, const std::string& name, int64_t rows, int64_t cols) {
  f.check_shape(name, {rows, cols});
  RowMatrix m(rows, cols);
  f.read_float(name, 0, static_cast<uint64_t>(rows * cols), m.data());
  return m;
}

Eigen::VectorXf read_vector(const SafetensorsFile& f, const std::string& name, int64_t n) {
  f.check_shape(name, {n});
  Eigen::VectorXf v(n);
  f.read_float(name, 0, static_cast<uint64_t>(n), v.data());
  return v;
}

}  // namespace

size_t DenseWeights::bytes() const {
  size_t n = static_cast<size_t>(embed.size() + lm_head.size() + final_norm.size());
  for (const auto& l : layers)
    n += static_cast<size_t>(l.attn_norm.size() + l.ffn_norm.size() + l.wq.size() + l.wk.size() +
                             l.wv.size() + l.wo.size() + l.q_norm.size() + l.k_norm.size() +
                             l.router.size());
  return n * sizeof(float);
}

DenseWeights DenseWeights::load(const std::filesystem::path& path, const ModelConfig& cfg) {
  SafetensorsFile f(path);
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size, hd = cfg.head_dim;
  const int64_t qd = int64_t{cfg.n_heads} * hd, kvd = int64_t{cfg.n_kv_heads} * hd;
  DenseWeights w;
  w.embed = read_matrix(f, "embed", V, D);
  w.final_norm = read_vector(f, "final_norm", D);
  if (!cfg.tie_word_embeddings) w.lm_head = read_matrix(f, "lm_head", V, D);
  w.layers.resize(static_cast<size_t>(cfg.n_layers));
  for (int i = 0; i < cfg.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.attn_norm = read_vector(f, p + "attn_norm", D);
    l.wq = read_matrix(f, p + "wq", qd, D);
    l.wk = read_matrix(f, p + "wk", kvd, D);
    l.wv = read_matrix(f, p + "wv", kvd, D);
    l.wo = read_matrix(f, p + "wo", D, qd);
    if (cfg.qk_norm == QkNorm::kPerHead) {
      l.q_norm = read_vector(f, p + "q_norm", hd);
      l.k_norm = read_vector(f, p + "k_norm", hd);
    } else if (cfg.qk_norm == QkNorm::kFull) {
      l.q_norm = read_vector(f, p + "q_norm", qd);
      l.k_norm = read_vector(f, p + "k_norm", kvd);
    }
    l.ffn_norm = read_vector(f, p + "ffn_norm", D);
    l.router = read_matrix(f, p + "router", cfg.n_experts, D);
  }
  return w;
}

}  // namespace moestream
