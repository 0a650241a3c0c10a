// Cache-aware routing: after the exact top-k, swap a non-resident expert for a resident one whose
// router logit is nearly as high, trading a bounded amount of routing fidelity for fewer misses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/model/cache_aware_options.h"
#include "runtime/model/routing.h"

namespace moestream {

// The cache-aware step of one layer's forward chunk, the same in the CPU and the GPU pass: every
// token's exact top-k against one residency snapshot (substitute_resident), the weights of the
// tokens that changed recomputed (routing_weights), the counters. Holds only scratch, sized once.
class CacheAwareRouter {
 public:
  CacheAwareRouter(int n_experts, int top_k, bool normalize);
  // resident[e] != 0: expert e of the layer is resident, sampled once before the chunk's experts
  // are asked for. logits: [T, n_experts] raw router logits; ids, weights: [T, top_k] exact
  // top-k, token-major, rewritten in place. An expert chosen by an earlier token of the chunk
  // does not count as resident: only the tiers decide. Returns the number of slots changed.
  // bias: the sigmoid router's correction bias [n_experts] (set_grouped), else null.
  // union_splits (the union rule, CacheAwareOptions::batch_union): row boundaries of the
  // sequences of a batch step, 0 first and T last, in the step's order; the rows of sequence i
  // also count as resident every expert the rows of sequences 0..i-1 finally chose (read once
  // for the step anyway), never those of their own sequence. Empty or one range: no union.
  // Misses are still counted against `resident` alone: they are the step's reads.
  int apply(std::span<const uint8_t> resident, const float* logits, int T, float tolerance,
            int* ids, float* weights, CacheAwareStats& stats, const float* bias = nullptr,
            std::span<const int> union_splits = {});
  // GLM-4.5 / DeepSeek-V3: substitute with substitute_resident_grouped (routing.h) and weigh with
  // sigmoid_routing_weights instead of the softmax rule.
  void set_grouped(const RouterParams& p);

 private:
  int E_, K_;
  bool normalize_;
  std::vector<float> probs_;                       // [E]
  std::vector<int> exact_ids_;                     // [K]: one token's exact top-k
  std::vector<uint8_t> seen_before_, seen_after_;  // [E]: distinct experts of the chunk
  std::vector<uint8_t> resident_union_;            // [E]: resident, or chosen by an earlier sequence
  bool grouped_ = false;
  RouterParams params_;
  std::vector<float> grouped_scratch_;
};

}  // namespace moestream
