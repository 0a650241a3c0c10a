// Test support: how far one pass's logits are from another's, and a deterministic prompt. The GPU
// suites compare --gpu against the CPU pass, the reference tests the CPU pass against transformers'
// logits with these. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace moestream::test {

// One row of logits against its reference: max |want - got| and max |want| (the row's scale).
struct RowError {
  double err = 0, scale = 0;
};
inline RowError row_error(std::span<const float> want, const float* got) {
  RowError r;
  for (size_t v = 0; v < want.size(); ++v) {
    r.scale = std::max(r.scale, double(std::fabs(want[v])));
    r.err = std::max(r.err, double(std::fabs(want[v] - got[v])));
  }
  return r;
}

// Whether the two rows of logits put their largest value at the same id (the first on ties).
inline bool same_top1(std::span<const float> want, const float* got) {
  return std::max_element(want.begin(), want.end()) - want.begin() ==
         std::max_element(got, got + want.size()) - got;
}

// The two largest logits of a row: (best id, gap to the second).
inline std::pair<int, float> top2(std::span<const float> row) {
  int best = 0;
  for (int i = 1; i < int(row.size()); ++i)
    if (row[size_t(i)] > row[size_t(best)]) best = i;
  float second = -INFINITY;
  for (int i = 0; i < int(row.size()); ++i)
    if (i != best) second = std::max(second, row[size_t(i)]);
  return {best, row[size_t(best)] - second};
}

// Max over rows of max |a - b| / max |a| (the row's logit scale), a and b rows of V logits.
inline double rel_max_diff(std::span<const float> a, std::span<const float> b, size_t V) {
  double worst = 0;
  for (size_t r = 0; r * V < a.size(); ++r) {
    const RowError e = row_error(a.subspan(r * V, V), b.data() + r * V);
    worst = std::max(worst, e.err / e.scale);
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
