// Test support: how far one pass's logits are from another's, and a deterministic prompt. The GPU
// suites compare --gpu against the CPU pass (and transformers) with these. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace moestream::test {

// Max over rows of max |a - b| / max |a| (the row's logit scale), a and b rows of V logits.
inline double rel_max_diff(std::span<const float> a, std::span<const float> b, size_t V) {
  double worst = 0;
  for (size_t r = 0; r * V < a.size(); ++r) {
    double scale = 0, err = 0;
    for (size_t v = r * V; v < (r + 1) * V; ++v) {
      scale = std::max(scale, double(std::fabs(a[v])));
      err = std::max(err, double(std::fabs(a[v] - b[v])));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

// A prompt of n ids spread over the vocabulary (deterministic, not all in one region).
inline std::vector<int> prompt_ids(int n, int vocab) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back(int((1009LL * i + 17) % vocab));
  return p;
}

}  // namespace moestream::test
