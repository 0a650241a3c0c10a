// Implementation of runtime/model/routing.h. Plain loops: k <= 8 and n_experts <= a few hundred per
// (token, layer); selection by repeated argmax keeps ties deterministic (lower index first).
#include "runtime/model/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "runtime/model/cache_aware_router.h"
#include "runtime/model/moe_layer.h"

namespace moestream {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Fills choice[E] (biased scores) and kept[n_group] (1: the group competes). scratch layout:
// [choice E][E floats: substitute_resident_grouped's candidate flags][group score G][kept G].
struct GroupedChoice {
  float* choice;
  float* kept;
};

GroupedChoice grouped_choice(const RouterParams& p, const float* logits, const float* bias,
                             std::span<float> scratch) {
  MOE_ASSERT(scratch.size() >= p.scratch_floats(), "router scratch too small");
  const int E = p.n_experts, G = p.n_group, per = E / G;
  float* choice = scratch.data();
  float* gscore = scratch.data() + 2 * size_t(E);
  float* kept = gscore + G;
  for (int e = 0; e < E; ++e) choice[e] = sigmoid(logits[e]) + (bias != nullptr ? bias[e] : 0.0f);
  if (G == 1) {
    kept[0] = 1;
    return {choice, kept};
  }
  for (int g = 0; g < G; ++g) {
    // The sum of the group's two best values (per >= 2: model.json checks it).
    float a = -INFINITY, b = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      if (choice[e] > a) {
        b = a;
        a = choice[e];
      } else if (choice[e] > b) {
        b = choice[e];
      }
    }
    gscore[g] = a + b;
    kept[g] = 0;
  }
  for (int j = 0; j < p.topk_group; ++j) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (kept[g] == 0 && (best < 0 || gscore[g] > gscore[best])) best = g;
    kept[best] = 1;
  }
  return {choice, kept};
}

// DeepSeek-V2 (issue 20): probs [E] (softmax as route_token computes it) and kept [n_group] (1:
// the group competes; a group scores its best probability), in route()'s scratch layout.
GroupedChoice softmax_grouped_choice(const RouterParams& p, const float* logits, std::span<float> scratch) {
  MOE_ASSERT(scratch.size() >= p.scratch_floats(), "router scratch too small");
  const int E = p.n_experts, G = p.n_group, per = E / G;
  float* probs = scratch.data();
  float* gscore = scratch.data() + 2 * size_t(E);
  float* kept = gscore + G;
  float m = logits[0];
  for (int e = 1; e < E; ++e) m = std::max(m, logits[e]);
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += probs[e] = std::exp(logits[e] - m);
  for (int e = 0; e < E; ++e) probs[e] /= sum;
  for (int g = 0; g < G; ++g) {
    float best = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) best = std::max(best, probs[e]);
    gscore[g] = best;
    kept[g] = G == 1 ? 1.0f : 0.0f;
  }
  for (int j = 0; j < p.topk_group && G > 1; ++j) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (kept[g] == 0 && (best < 0 || gscore[g] > gscore[best])) best = g;
    kept[best] = 1;
  }
  return {probs, kept};
}

int substitute_resident_softmax_grouped(const RouterParams& p, const float* logits,
                                        std::span<const uint8_t> resident, float tolerance, int* ids,
                                        std::span<float> scratch) {
  const GroupedChoice gc = softmax_grouped_choice(p, logits, scratch);
  const int per = p.n_experts / p.n_group;
  auto* candidate = reinterpret_cast<uint8_t*>(scratch.data() + p.n_experts);
  for (int e = 0; e < p.n_experts; ++e) candidate[e] = gc.kept[e / per] != 0 && resident[size_t(e)];
  return substitute_resident(logits, p.n_experts, p.k,
                             std::span<const uint8_t>(candidate, size_t(p.n_experts)), tolerance, ids);
}

}  // namespace

void route_softmax_grouped(const RouterParams& p, const float* logits, int* ids, float* weights,
                           std::span<float> scratch) {
  MOE_ASSERT(p.k > 0 && p.k <= p.n_experts && p.n_group > 0 && p.n_experts % p.n_group == 0 &&
             p.topk_group >= 1 && p.topk_group <= p.n_group);
  const GroupedChoice gc = softmax_grouped_choice(p, logits, scratch);
  const int per = p.n_experts / p.n_group;
  for (int j = 0; j < p.k; ++j) {  // repeated argmax, as route_token: ties to the lower id
    int best = -1;
    for (int e = 0; e < p.n_experts; ++e) {
      if (gc.kept[e / per] == 0) continue;
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= ids[i] == e;
      if (!taken && (best < 0 || gc.choice[e] > gc.choice[best])) best = e;
    }
    MOE_ASSERT(best >= 0, "kept groups hold fewer than k experts");
    ids[j] = best;
    weights[j] = gc.choice[best];
  }
  if (p.normalize) {
    float s = 0;
    for (int j = 0; j < p.k; ++j) s += weights[j];
    for (int j = 0; j < p.k; ++j) weights[j] /= s;
  }
  for (int j = 0; j < p.k; ++j) weights[j] *= p.scaling;
}

void grouped_routing_weights(const RouterParams& p, const float* logits, const int* ids, float* weights,
                             std::span<float> scratch) {
  if (p.scoring == RouterScoring::kSigmoid) {
    sigmoid_routing_weights(p, logits, ids, weights);
    return;
  }
  const float* probs = softmax_grouped_choice(p, logits, scratch).choice;
  for (int j = 0; j < p.k; ++j) weights[j] = probs[ids[j]];
  if (p.normalize) {
    float s = 0;
    for (int j = 0; j < p.k; ++j) s += weights[j];
    for (int j = 0; j < p.k; ++j) weights[j] /= s;
  }
  for (int j = 0; j < p.k; ++j) weights[j] *= p.scaling;
}

RouterParams RouterParams::of(const ModelConfig& cfg) {
  RouterParams p;
  p.scoring = cfg.router_scoring;
  p.n_experts = cfg.n_experts;
  p.k = cfg.n_experts_per_tok;
  p.normalize = cfg.norm_topk_prob;
  p.n_group = cfg.n_group;
  p.topk_group = cfg.topk_group;
  p.scaling = static_cast<float>(cfg.routed_scaling_factor);
  return p;
}

void sigmoid_routing_weights(const RouterParams& p, const float* logits, const int* ids, float* weights) {
  float sum = 0;
  for (int j = 0; j < p.k; ++j) sum += weights[j] = sigmoid(logits[ids[j]]);
  const float denom = p.normalize ? sum + 1e-20f : 1.0f;
  for (int j = 0; j < p.k; ++j) weights[j] = weights[j] / denom * p.scaling;
}

void route_sigmoid_grouped(const RouterParams& p, const float* logits, const float* bias, int* ids,
                           float* weights, std::span<float> scratch) {
  MOE_ASSERT(p.k > 0 && p.k <= p.n_experts && p.n_group > 0 && p.n_experts % p.n_group == 0);
  const GroupedChoice gc = grouped_choice(p, logits, bias, scratch);
  const int per = p.n_experts / p.n_group;
  for (int j = 0; j < p.k; ++j) {
    int best = -1;
    for (int e = 0; e < p.n_experts; ++e) {
      if (gc.kept[e / per] == 0) continue;
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= ids[i] == e;
      if (!taken && (best < 0 || gc.choice[e] > gc.choice[best])) best = e;
    }
    MOE_ASSERT(best >= 0, "kept groups hold fewer than k experts");
    ids[j] = best;
  }
  sigmoid_routing_weights(p, logits, ids, weights);
}

void route(const RouterParams& p, const float* logits, const float* bias, int* ids, float* weights,
           std::span<float> scratch) {
  if (p.scoring == RouterScoring::kSigmoid) {
    route_sigmoid_grouped(p, logits, bias, ids, weights, scratch);
    return;
  }
  if (p.n_group > 1) {  // DeepSeek-V2's group_limited_greedy
    route_softmax_grouped(p, logits, ids, weights, scratch);
    return;
  }
  MOE_ASSERT(scratch.size() >= size_t(p.n_experts), "router scratch too small");
  route_token(logits, p.n_experts, p.k, p.normalize, ids, weights, scratch.data());
  if (p.scaling != 1.0f)
    for (int j = 0; j < p.k; ++j) weights[j] *= p.scaling;
}

int substitute_resident_grouped(const RouterParams& p, const float* logits, const float* bias,
                                std::span<const uint8_t> resident, float tolerance, int* ids,
                                std::span<float> scratch) {
  MOE_ASSERT(resident.size() == size_t(p.n_experts), "resident must hold n_experts flags");
  if (p.k <= 0 || !(tolerance > 0)) return 0;
  if (p.scoring == RouterScoring::kSoftmax)
    return substitute_resident_softmax_grouped(p, logits, resident, tolerance, ids, scratch);
  const GroupedChoice gc = grouped_choice(p, logits, bias, scratch);
  // The softmax rule on the biased choice values, with an expert of a dropped group counted as
  // not resident: it can then never come in, and a selected expert is in a kept group anyway.
  // The flags go in the scratch's second E floats (byte access to them is allowed).
  const int per = p.n_experts / p.n_group;
  auto* candidate = reinterpret_cast<uint8_t*>(scratch.data() + p.n_experts);
  for (int e = 0; e < p.n_experts; ++e) candidate[e] = gc.kept[e / per] != 0 && resident[size_t(e)];
  return substitute_resident(gc.choice, p.n_experts, p.k,
                             std::span<const uint8_t>(candidate, size_t(p.n_experts)), tolerance, ids);
}

}  // namespace moestream
