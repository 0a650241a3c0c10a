// Rotary position embedding as Hugging Face computes it (rotate_half layout): inverse frequencies
// from the config's theta and rope_scaling (linear, dynamic NTK, YaRN, llama3), cos/sin per position.
#pragma once

#include <vector>

#include "loader/format/model_config.h"

namespace moestream {

// YaRN's magnitude scale 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1), as DeepSeek defines it.
double yarn_mscale(double scale, double mscale);

class Rope {
 public:
  // Over head_dim, or MLA's qk_rope_head_dim.
  explicit Rope(const ModelConfig& cfg);

  int half_dim() const { return half_dim_; }
  // cos/sin tables [n_pos, half_dim] for positions first_pos.. first_pos+n_pos-1, the YaRN
  // attention factor folded in. Dynamic NTK uses seq_len = last position + 1, as HF does.
  void fill(int first_pos, int n_pos, float* cos_out, float* sin_out) const;
  // Rotates one head vector of 2*half_dim floats in place (x[i], x[i+half] pairs).
  static void apply(float* x, const float* cos, const float* sin, int half_dim);
  // Inverse frequencies in effect for a sequence of seq_len tokens.
  std::vector<float> inv_freq(int seq_len) const;

 private:
  static std::vector<float> default_inv_freq(double base, int dim);

  int dim_ = 0, half_dim_ = 0;
  double theta_ = 10000;
  int max_pos_ = 0;
  std::vector<float> inv_freq_;  // static part (all types but dynamic)
  float attention_factor_ = 1.0f;
  bool dynamic_ = false;
  double dynamic_factor_ = 1;
};

}  // namespace moestream
