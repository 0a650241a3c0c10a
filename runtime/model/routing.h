// The router primitives: scoring and top-k selection by architecture (softmax top-k of Qwen3,
// OLMoE, Mixtral, Qwen2-MoE; gpt-oss's softmax over the selected logits; the grouped sigmoid
// router of GLM-4.5 and DeepSeek-V3 with its correction bias; DeepSeek-V2's grouped softmax), the
// cache-aware substitution rules and the weights of a given selection. One definition for the
// CPU pass, the GPU kernels' reference and cache-aware routing; pure functions of their inputs.
// The per-chunk orchestration around them is runtime/model/routing_step.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "loader/format/model_config.h"

namespace moestream {

// The one top-k of the CPU: the k largest values[0..n) by repeated argmax, best first, ties to
// the lower index. With kept_groups set, only indices e whose group kept_groups[e / group_size] is
// non-zero compete (the grouped routers). ids receives k entries; asserts that k candidates exist.
void select_top_k(const float* values, int n, int k, int* ids, const float* kept_groups = nullptr,
                  int group_size = 1);

// Top-k routing of one token: softmax over all experts, the k largest (ties: lower id first),
// renormalised to sum 1 when `normalize`. ids/weights receive k entries; probs_scratch: n_experts.
void route_token(const float* logits, int n_experts, int k, bool normalize, int* ids,
                 float* weights, float* probs_scratch);

// gpt-oss's router: the k largest logits (ties: lower id first), weights = softmax over those k.
void route_token_topk_softmax(const float* logits, int n_experts, int k, int* ids, float* weights);

// The routing fields of a ModelConfig.
struct RouterParams {
  RouterScoring scoring = RouterScoring::kSoftmax;
  int n_experts = 0, k = 0;
  bool normalize = true;
  int n_group = 1, topk_group = 1;
  float scaling = 1.0f;  // routed_scaling_factor

  static RouterParams of(const ModelConfig& cfg);
  // Floats of scratch route() needs.
  size_t scratch_floats() const { return 2 * size_t(n_experts) + 2 * size_t(n_group); }
};

// Grouped sigmoid routing of one token, as transformers' Glm4MoeTopkRouter / DeepseekV3TopkRouter:
// scores = sigmoid(logits); choice = scores + bias (bias: e_score_correction_bias, [n_experts],
// used for selection only); a group's score is the sum of its two best choice values; the
// topk_group best groups are kept and the k best choice values among their experts selected
// (ids best first; ties: lower group, then lower id). weights = the chosen unbiased scores, divided
// by their sum (+1e-20) when normalize, times scaling. With n_group 1 no group is masked.
void route_sigmoid_grouped(const RouterParams& p, const float* logits, const float* bias, int* ids,
                           float* weights, std::span<float> scratch);

// DeepSeek-V2's group-limited greedy router (topk_method "group_limited_greedy", issue 20), of one
// token, as transformers' DeepseekV2TopkRouter: probs = softmax(logits) over all experts (as
// route_token computes it); a group's score is its best probability; the topk_group best groups
// are kept (ties: lower group) and the k best probabilities among their experts selected (ids
// best first; ties: lower id); weights = those probabilities, divided by their sum when
// normalize, times scaling. With n_group 1 it is route_token, then the scaling.
void route_softmax_grouped(const RouterParams& p, const float* logits, int* ids, float* weights,
                           std::span<float> scratch);

// Either router, as p.scoring says (softmax: route_token, then the scaling; route_softmax_grouped
// when n_group > 1). bias may be null for softmax scoring.
void route(const RouterParams& p, const float* logits, const float* bias, int* ids, float* weights,
           std::span<float> scratch);

// The sigmoid router's weights of a given selection ids[0..k) (cache-aware routing recomputes
// them after a substitution): unbiased sigmoid scores, normalised, scaled.
void sigmoid_routing_weights(const RouterParams& p, const float* logits, const int* ids, float* weights);

// The tolerance applies to raw router LOGITS (before softmax): a resident expert c may replace a
// selected, non-resident expert s when logit[s] - logit[c] <= tolerance * (logit[top1] -
// logit[topk]) (the top-k logit range); with k = 1 the range is 0, so tolerance is then an
// absolute logit difference. Logits, not probabilities, because a logit gap bounds the
// probability ratio: p_c >= p_s * exp(-allowed gap), whatever the rest of the distribution.
// Rewrites ids[0..k) (exact top-k, best first) in place: for each slot whose expert is not
// resident, weakest slot first, the best resident expert not already selected whose logit is within
// the allowance takes that slot; ties go to the lower id. resident[e] != 0 marks expert e
// resident. A substituted slot keeps its position. Returns the number of slots changed.
// tolerance <= 0 or k <= 0 changes nothing; k is clamped to n_experts.
int substitute_resident(const float* logits, int n_experts, int k, std::span<const uint8_t> resident,
                        float tolerance, int* ids);

// Router weights of the experts in ids[0..k), as the architecture computes them: softmax over all
// logits, each selected expert's probability, renormalised to sum 1 when `normalize`
// (Qwen3 norm_topk_prob; Mixtral's softmax over the top-k logits is the same thing). probs_scratch
// holds n_experts floats.
void routing_weights(const float* logits, int n_experts, const int* ids, int k, bool normalize,
                     float* weights, float* probs_scratch);

// Whether cache-aware routing takes the grouped rule below (substitute_resident_grouped, and
// grouped_routing_weights for the weights): the sigmoid router, and the softmax router with
// groups or a scaling factor (DeepSeek-V2).
inline bool grouped_cache_aware(const RouterParams& p) {
  return p.scoring == RouterScoring::kSigmoid || p.n_group > 1 || p.scaling != 1.0f;
}
// The weights grouped_cache_aware routers give a selection ids[0..k): sigmoid_routing_weights, or
// for softmax scoring the selected probabilities (normalised when p.normalize) times p.scaling.
// scratch as route().
void grouped_routing_weights(const RouterParams& p, const float* logits, const int* ids, float* weights,
                             std::span<float> scratch);

// Cache-aware substitution for the grouped sigmoid router (docs/cache_aware.md). Near-tied is
// measured on the biased selection values (choice = sigmoid(logit) + bias), the quantity the
// router ranks, and only inside the groups the router kept: a resident, unselected expert c of a
// kept group may replace a selected non-resident s when choice[s] - choice[c] <= tolerance *
// (choice[top1] - choice[topk]) (tolerance itself when k = 1). Weakest slot first, best candidate
// first, ties to the lower id; a replaced slot keeps its position. tolerance <= 0 changes nothing.
// Softmax scoring (DeepSeek-V2, grouped_cache_aware): the same rule inside the kept groups (by
// their best probability, as route_softmax_grouped keeps them), near-tied measured on the raw
// logits as the plain softmax router's (ranking the logits is ranking the probabilities).
// Returns the slots changed. scratch as route().
int substitute_resident_grouped(const RouterParams& p, const float* logits, const float* bias,
                                std::span<const uint8_t> resident, float tolerance, int* ids,
                                std::span<float> scratch);

}  // namespace moestream
