// Implementation of runtime/model/rope.h, following transformers' modeling_rope_utils: frequencies are
// rounded to float32 and angles formed in float32 as there, so long positions match the reference.
#include "runtime/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/error.h"

namespace moestream {

namespace {
// MLA rotates only its qk_rope_head_dim RoPE part; other models rope_dim() of each head.
int rotated_dim(const ModelConfig& cfg) { return cfg.has_mla() ? cfg.qk_rope_head_dim : cfg.rope_dim(); }
}  // namespace

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

std::vector<float> Rope::default_inv_freq(double base, int dim) {
  std::vector<float> f(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i)
    f[static_cast<size_t>(i)] = static_cast<float>(1.0 / std::pow(base, (2.0 * i) / dim));
  return f;
}

Rope::Rope(const ModelConfig& cfg)
    : dim_(rotated_dim(cfg)), half_dim_(rotated_dim(cfg) / 2), theta_(cfg.rope_theta),
      max_pos_(cfg.max_position_embeddings) {
  if (dim_ <= 0 || dim_ % 2 != 0)
    throw ConfigError("model.json: the rotary width (head_dim or rotary_dim) must be even for RoPE, got " +
                      std::to_string(dim_));
  inv_freq_ = default_inv_freq(theta_, dim_);
  if (!cfg.rope_scaling) return;
  const RopeScaling& s = *cfg.rope_scaling;
  const double factor = s.factor;
  if (s.type == "linear") {
    for (float& f : inv_freq_) f = static_cast<float>(f / factor);
  } else if (s.type == "dynamic") {
    dynamic_ = true;
    dynamic_factor_ = factor;
  } else if (s.type == "yarn") {
    const double orig = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                               : double(max_pos_);
    attention_factor_ = factor <= 1 ? 1.0f : static_cast<float>(0.1 * std::log(factor) + 1.0);
    if (s.mscale != 0 && s.mscale_all_dim != 0)  // DeepSeek's ratio (transformers' yarn)
      attention_factor_ = static_cast<float>(yarn_mscale(factor, s.mscale) / yarn_mscale(factor, s.mscale_all_dim));
    auto correction_dim = [&](double rotations) {
      return (dim_ * std::log(orig / (rotations * 2 * std::numbers::pi))) / (2 * std::log(theta_));
    };
    // gpt-oss sets truncate false: the correction range keeps its fractional ends.
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim_ - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half_dim_; ++i) {
      double pos_freq = std::pow(theta_, (2.0 * i) / dim_);
      double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (factor * pos_freq);
      double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      double extra_factor = 1.0 - ramp;
      inv_freq_[static_cast<size_t>(i)] =
          static_cast<float>(interpolation * (1 - extra_factor) + extrapolation * extra_factor);
    }
  } else if (s.type == "llama3") {
    const double old_ctx = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                                  : double(max_pos_);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (float& f : inv_freq_) {
      double inv = f, wavelen = 2 * std::numbers::pi / inv;
      double scaled = wavelen > low_wavelen ? inv / factor : inv;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        scaled = (1 - smooth) * scaled / factor + smooth * scaled;
      }
      f = static_cast<float>(scaled);
    }
  } else {
    throw ConfigError("model.json: field rope.scaling.type: unsupported value '" + s.type + "'");
  }
}

std::vector<float> Rope::inv_freq(int seq_len) const {
  if (!dynamic_ || seq_len <= max_pos_) return inv_freq_;
  double base = theta_ * std::pow(dynamic_factor_ * seq_len / max_pos_ - (dynamic_factor_ - 1),
                                  double(dim_) / (dim_ - 2));
  return default_inv_freq(base, dim_);
}

void Rope::fill(int first_pos, int n_pos, float* cos_out, float* sin_out) const {
  // Only the dynamic type needs a fresh table; the copy is half_dim floats per forward call.
  std::vector<float> dyn;
  const std::vector<float>* freq = &inv_freq_;
  if (dynamic_) {
    dyn = inv_freq(first_pos + n_pos);
    freq = &dyn;
  }
  for (int p = 0; p < n_pos; ++p) {
    const float pos = static_cast<float>(first_pos + p);
    for (int i = 0; i < half_dim_; ++i) {
      const float angle = (*freq)[static_cast<size_t>(i)] * pos;  // float32, as HF does
      const size_t k = static_cast<size_t>(p) * half_dim_ + i;
      cos_out[k] = static_cast<float>(std::cos(double(angle))) * attention_factor_;
      sin_out[k] = static_cast<float>(std::sin(double(angle))) * attention_factor_;
    }
  }
}

void Rope::apply(float* x, const float* cos, const float* sin, int half_dim) {
  for (int i = 0; i < half_dim; ++i) {
    const float a = x[i], b = x[i + half_dim];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half_dim] = b * cos[i] + a * sin[i];
  }
}

}  // namespace moestream
