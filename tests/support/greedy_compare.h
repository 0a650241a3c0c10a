// Test support: greedy decoding, two models' prefill logits compared, and two models fed the same
// prompt and the same greedy tokens, their logits compared bit for bit after the prompt and after every decode step (the GPU suites'
// "the same bits as the other path" checks). Header-only; needs runtime/engine (Model) and gtest.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/logit_compare.h"

namespace moestream::test {

// The n tokens greedy decoding gives after `prompt`, from a reset model (each token fed back
// through the KV cache).
inline std::vector<int> greedy_tokens(Model& m, const std::vector<int>& prompt, size_t n) {
  std::vector<int> ids;
  std::vector<float> last(size_t(m.config().vocab_size));
  m.reset();
  m.forward(prompt, last);
  for (size_t i = 0; i < n; ++i) {
    const int next = Sampler::argmax(last);
    ids.push_back(next);
    if (i + 1 < n) m.forward(std::span<const int>(&next, 1), last);
  }
  return ids;
}

// Both models prefill `prompt` (every position's logits): rel_max_diff of b's logits from a's.
inline double prefill_rel_diff(Model& a, Model& b, const std::vector<int>& prompt) {
  const size_t V = size_t(a.config().vocab_size);
  std::vector<float> la(prompt.size() * V), lb(prompt.size() * V);
  a.forward(prompt, la, true);
  b.forward(prompt, lb, true);
  return rel_max_diff(la, lb, V);
}

// How many leading tokens of got equal want's.
inline size_t matching_prefix(const std::vector<int>& got, const std::vector<int>& want) {
  size_t same = 0;
  while (same < got.size() && same < want.size() && got[same] == want[same]) ++same;
  return same;
}

// Greedy decode of `steps` tokens on both after `prompt` (the tokens a's logits choose), each
// step's logits equal; a gtest failure names the first step that differs.
inline void greedy_both_bitwise(Model& a, Model& b, const std::vector<int>& prompt, int steps) {
  const size_t V = size_t(a.config().vocab_size);
  std::vector<float> la(V), lb(V);
  a.forward(prompt, la);
  b.forward(prompt, lb);
  ASSERT_EQ(std::memcmp(la.data(), lb.data(), V * 4), 0) << "prefill";
  for (int i = 0; i < steps; ++i) {
    const int tok = Sampler::argmax(la);
    a.forward(std::span<const int>(&tok, 1), la);
    b.forward(std::span<const int>(&tok, 1), lb);
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), V * 4), 0) << "decode step " << i;
  }
}

}  // namespace moestream::test
