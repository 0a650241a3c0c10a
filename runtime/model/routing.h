// Router scoring and top-k selection by architecture: softmax top-k (Qwen3, OLMoE, Mixtral,
// Qwen2-MoE) and the grouped sigmoid router of GLM-4.5 and DeepSeek-V3, with its correction bias.
// One definition for the CPU pass, the GPU kernel's reference and cache-aware routing.
#pragma once

#include <cstddef>
#include <span>

#include "loader/format/model_config.h"

namespace moestream {

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
