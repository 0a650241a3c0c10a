// Next-token choice from logits: greedy at temperature 0, otherwise temperature, top-k and top-p
// (nucleus) filtering and a draw from a seeded generator, so a seed reproduces a run exactly.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moestream {

struct SamplerParams {
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = no limit
  float top_p = 0.95f;       // 1 = no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);  // throws ConfigError for out-of-range parameters
  int sample(std::span<const float> logits);
  // Temperature 0: sample() is argmax(), so a caller may let the forward pass pick the token
  // (Model::forward_argmax) instead of copying the logits out.
  bool greedy() const { return p_.temperature == 0; }
  // Index of the largest logit; the lowest index wins a tie; NaN never wins (all NaN: 0). The
  // GPU's gpu::argmax follows the same rule.
  static int argmax(std::span<const float> logits);

 private:
  struct Candidate {
    int id;
    float p;  // weight: exp((logit - the largest) / temperature)
  };
  template <class Before>
  int nucleus_to_front(int n, double target, const Before& before);

  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<int> ids_;         // top-k's ids (reused across calls)
  std::vector<Candidate> cand_;  // the candidates and their weights (reused across calls)
};

}  // namespace moestream
