// Implementation of runtime/model/routing.h. Plain loops: k <= 8 and n_experts <= a few hundred per
// (token, layer); selection by repeated argmax keeps ties deterministic (lower index first).
#include "runtime/model/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/error.h"

namespace moestream {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// probs[e] = softmax(logits)[e] over n entries (max subtracted first).
void softmax(const float* logits, int n, float* probs) {
  float m = logits[0];
  for (int e = 1; e < n; ++e) m = std::max(m, logits[e]);
  float sum = 0;
  for (int e = 0; e < n; ++e) sum += probs[e] = std::exp(logits[e] - m);
  for (int e = 0; e < n; ++e) probs[e] /= sum;
}

// The selected weights divided by their sum when normalize (plus eps), then times scaling.
void finish_weights(float* weights, int k, bool normalize, float scaling, float eps = 0.0f) {
  float s = 0;
  for (int j = 0; j < k; ++j) s += weights[j];
  const float denom = normalize ? s + eps : 1.0f;
  for (int j = 0; j < k; ++j) weights[j] = weights[j] / denom * scaling;
}

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
  softmax(logits, E, probs);
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

void select_top_k(const float* values, int n, int k, int* ids, const float* kept_groups, int group_size) {
  MOE_ASSERT(k >= 0 && k <= n && group_size >= 1);
  for (int j = 0; j < k; ++j) {  // k is small (<= 8 in practice): selection beats a sort
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (kept_groups != nullptr && kept_groups[e / group_size] == 0) continue;
      if (std::find(ids, ids + j, e) != ids + j) continue;
      if (best < 0 || values[e] > values[best]) best = e;  // strict: ties keep the lower index
    }
    MOE_ASSERT(best >= 0, "fewer than k candidates (kept groups too small)");
    ids[j] = best;
  }
}

void route_token(const float* logits, int n_experts, int k, bool normalize, int* ids, float* weights,
                 float* probs) {
  softmax(logits, n_experts, probs);
  select_top_k(probs, n_experts, k, ids);
  for (int j = 0; j < k; ++j) weights[j] = probs[ids[j]];
  finish_weights(weights, k, normalize, 1.0f);
}

void route_token_topk_softmax(const float* logits, int n_experts, int k, int* ids, float* weights) {
  select_top_k(logits, n_experts, k, ids);
  const float m = logits[ids[0]];  // the largest
  float sum = 0;
  for (int j = 0; j < k; ++j) sum += weights[j] = std::exp(logits[ids[j]] - m);
  for (int j = 0; j < k; ++j) weights[j] /= sum;
}

int substitute_resident(const float* logits, int n_experts, int k, std::span<const uint8_t> resident,
                        float tolerance, int* ids) {
  MOE_ASSERT(resident.size() == size_t(n_experts), "resident must hold n_experts flags");
  k = std::min(k, n_experts);
  if (k <= 0 || !(tolerance > 0)) return 0;
  // ids arrive best first, so the range is first minus last.
  const float range = logits[ids[0]] - logits[ids[k - 1]];
  const float allowance = k == 1 ? tolerance : tolerance * range;
  int changed = 0;
  for (int j = k - 1; j >= 0; --j) {  // weakest first: it has the most to gain and least to lose
    const int s = ids[j];
    if (resident[size_t(s)]) continue;
    int best = -1;
    for (int c = 0; c < n_experts; ++c) {
      if (!resident[size_t(c)] || std::find(ids, ids + k, c) != ids + k) continue;
      if (best < 0 || logits[c] > logits[best]) best = c;  // strict: ties keep the lower id
    }
    if (best >= 0 && logits[s] - logits[best] <= allowance) {
      ids[j] = best;
      ++changed;
    }
  }
  return changed;
}

void routing_weights(const float* logits, int n_experts, const int* ids, int k, bool normalize,
                     float* weights, float* probs) {
  softmax(logits, n_experts, probs);
  for (int j = 0; j < k; ++j) weights[j] = probs[ids[j]];
  finish_weights(weights, k, normalize, 1.0f);
}

void route_softmax_grouped(const RouterParams& p, const float* logits, int* ids, float* weights,
                           std::span<float> scratch) {
  MOE_ASSERT(p.k > 0 && p.k <= p.n_experts && p.n_group > 0 && p.n_experts % p.n_group == 0 &&
             p.topk_group >= 1 && p.topk_group <= p.n_group);
  const GroupedChoice gc = softmax_grouped_choice(p, logits, scratch);
  select_top_k(gc.choice, p.n_experts, p.k, ids, gc.kept, p.n_experts / p.n_group);
  for (int j = 0; j < p.k; ++j) weights[j] = gc.choice[ids[j]];
  finish_weights(weights, p.k, p.normalize, p.scaling);
}

void grouped_routing_weights(const RouterParams& p, const float* logits, const int* ids, float* weights,
                             std::span<float> scratch) {
  if (p.scoring == RouterScoring::kSigmoid) {
    sigmoid_routing_weights(p, logits, ids, weights);
    return;
  }
  const float* probs = softmax_grouped_choice(p, logits, scratch).choice;
  for (int j = 0; j < p.k; ++j) weights[j] = probs[ids[j]];
  finish_weights(weights, p.k, p.normalize, p.scaling);
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
  for (int j = 0; j < p.k; ++j) weights[j] = sigmoid(logits[ids[j]]);
  finish_weights(weights, p.k, p.normalize, p.scaling, 1e-20f);
}

void route_sigmoid_grouped(const RouterParams& p, const float* logits, const float* bias, int* ids,
                           float* weights, std::span<float> scratch) {
  MOE_ASSERT(p.k > 0 && p.k <= p.n_experts && p.n_group > 0 && p.n_experts % p.n_group == 0);
  const GroupedChoice gc = grouped_choice(p, logits, bias, scratch);
  select_top_k(gc.choice, p.n_experts, p.k, ids, gc.kept, p.n_experts / p.n_group);
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
