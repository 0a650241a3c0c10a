// The greedy pick's rule, written plainly for the tests of Sampler::argmax and gpu::argmax: the
// lowest index of the largest value, NaN skipped, 0 when every value is NaN.
#pragma once

#include <cmath>
#include <vector>

namespace moestream::test {

inline int argmax_reference(const std::vector<float>& v) {
  int best = -1;
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[size_t(best)])) best = int(i);
  return best < 0 ? 0 : best;
}

}  // namespace moestream::test
