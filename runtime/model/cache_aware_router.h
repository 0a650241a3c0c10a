// Cache-aware routing: after the exact top-k, swap a non-resident expert for a resident one whose
// router logit is nearly as high, trading a bounded amount of routing fidelity for fewer misses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/model/routing.h"

namespace moestream {

// The tolerance applies to raw router LOGITS (before softmax): a resident expert c may replace a
// selected, non-resident expert s when logit[s] - logit[c] <= tolerance * (logit[top1] -
// logit[topk]) (the top-k logit range); with k = 1 the range is 0, so tolerance is then an
// absolute logit difference. Logits, not probabilities, because a logit gap bounds the
// probability ratio: p_c >= p_s * exp(-allowed gap), whatever the rest of the distribution.
struct CacheAwareOptions {
  bool enabled = false;
  float tolerance = 0.10f;  // 0 = never substitute (routing identical to cache-aware off)
  // Batches of sequences (--cache-aware-union): an expert an earlier sequence of the same step
  // finally chose counts as resident too (the step reads it once for all). One sequence alone
  // routes exactly as without it (docs/cache_aware.md "Batches: the union rule").
  bool batch_union = false;
};

// Counters over (token, layer) routings since the last reset. Misses count distinct experts of a
// layer's forward chunk that are not resident (one read each), before and after substitution.
struct CacheAwareStats {
  uint64_t routings = 0;        // (token, layer) pairs routed
  uint64_t slots = 0;           // (token, layer, slot) choices: routings * k
  uint64_t slots_unchanged = 0; // choices left as exact top-k chose them
  uint64_t substitutions = 0;   // slots - slots_unchanged
  uint64_t layer_chunks = 0;    // residency snapshots taken (one per layer per forward chunk)
  uint64_t misses_before = 0;   // distinct non-resident experts exact top-k would read
  uint64_t misses_after = 0;    // distinct non-resident experts actually read
  double agreement() const { return slots ? double(slots_unchanged) / double(slots) : 1.0; }
  CacheAwareStats& operator+=(const CacheAwareStats& o);
};

// Rewrites ids[0..k) (exact top-k, best first) in place: for each slot whose expert is not
// resident, weakest slot first, the best resident expert not already selected whose logit is within
// the allowance (see CacheAwareOptions) takes that slot; ties go to the lower id. resident[e] != 0
// marks expert e resident. A substituted slot keeps its position. Returns the number of slots
// changed. tolerance <= 0 or k <= 0 changes nothing; k is clamped to n_experts.
int substitute_resident(const float* logits, int n_experts, int k, std::span<const uint8_t> resident,
                        float tolerance, int* ids);

// Router weights of the experts in ids[0..k), as the architecture computes them: softmax over all
// logits, each selected expert's probability, renormalised to sum 1 when `normalize`
// (Qwen3 norm_topk_prob; Mixtral's softmax over the top-k logits is the same thing). probs_scratch
// holds n_experts floats.
void routing_weights(const float* logits, int n_experts, const int* ids, int k, bool normalize,
                     float* weights, float* probs_scratch);

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
