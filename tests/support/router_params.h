// Test support: the RouterParams of a grouped router (DeepSeek-V2/V3, GLM-4.5: n_experts in
// n_group groups, the topk_group best kept, top-k inside them), as the CPU router tests and the GPU
// router kernels' tests sweep them. Header-only.
#pragma once

#include "runtime/model/routing.h"

namespace moestream::test {

inline RouterParams grouped_router(RouterScoring scoring, int n_experts, int k, int n_group, int topk_group,
                                   bool normalize, float scaling) {
  return RouterParams{.scoring = scoring, .n_experts = n_experts, .k = k, .normalize = normalize,
                      .n_group = n_group, .topk_group = topk_group, .scaling = scaling};
}

}  // namespace moestream::test
