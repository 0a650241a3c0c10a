// Tests of runtime/model/routing.h: the grouped sigmoid router of GLM-4.5 / DeepSeek-V3 (and
// DeepSeek-V2's group-limited greedy softmax router) against an
// independent sort-based reference on random inputs, hand-built cases for group masking, the bias
// (selection only), ties, scaling; its cache-aware substitution; the model.json fields it reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/format/model_config.h"
#include "runtime/model/cache_aware_router.h"
#include "runtime/model/routing.h"
#include "tests/support/router_params.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

RouterParams grouped(int E, int k, int G, int topk_group, bool normalize = true, float scaling = 1.0f) {
  return test::grouped_router(RouterScoring::kSigmoid, E, k, G, topk_group, normalize, scaling);
}

struct Routed {
  std::vector<int> ids;
  std::vector<float> weights;
};

Routed run(const RouterParams& p, const std::vector<float>& logits, const std::vector<float>& bias) {
  Routed r{std::vector<int>(size_t(p.k)), std::vector<float>(size_t(p.k))};
  std::vector<float> scratch(p.scratch_floats());
  route(p, logits.data(), bias.empty() ? nullptr : bias.data(), r.ids.data(), r.weights.data(), scratch);
  return r;
}

// The step both grouped definitions below share, as sorts (stable: ties to the lower index): the
// topk_group groups of the best group_score, then the k experts of the best score in them.
template <class T>
std::vector<int> best_in_best_groups(const RouterParams& p, const std::vector<T>& group_score,
                                     const std::vector<T>& score) {
  const int E = p.n_experts, G = p.n_group, per = E / G;
  std::vector<int> gi(static_cast<size_t>(G));
  std::iota(gi.begin(), gi.end(), 0);
  std::stable_sort(gi.begin(), gi.end(), [&](int a, int b) { return group_score[size_t(a)] > group_score[size_t(b)]; });
  std::vector<int> cand;
  for (int e = 0; e < E; ++e)
    if (std::find(gi.begin(), gi.begin() + p.topk_group, e / per) != gi.begin() + p.topk_group) cand.push_back(e);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  return std::vector<int>(cand.begin(), cand.begin() + p.k);
}

// transformers' definition written as sorts (stable: ties to the lower index).
Routed reference(const RouterParams& p, const std::vector<float>& logits, const std::vector<float>& bias) {
  const int E = p.n_experts, G = p.n_group, per = E / G;
  std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(e)]));
    c[size_t(e)] = s[size_t(e)] + bias[size_t(e)];
  }
  std::vector<float> gs(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    std::vector<float> v(c.begin() + g * per, c.begin() + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<float>());
    gs[size_t(g)] = v[0] + v[1];
  }
  Routed r;
  r.ids = best_in_best_groups(p, gs, c);
  double sum = 0;
  for (int id : r.ids) sum += s[size_t(id)];
  for (int id : r.ids) r.weights.push_back(float(s[size_t(id)] / (p.normalize ? sum + 1e-20 : 1.0) * p.scaling));
  return r;
}

TEST(GroupedSigmoidRouter, MatchesTheSortedDefinitionOnRandomInputs) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int shapes[][4] = {{16, 4, 4, 2}, {24, 6, 8, 3}, {12, 1, 1, 1}, {30, 5, 3, 2}, {256, 8, 8, 4}};
  for (const auto& sh : shapes) {
    const RouterParams p = grouped(sh[0], sh[1], sh[2], sh[3], sh[0] % 2 == 0, 2.5f);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> logits(size_t(p.n_experts)), bias(size_t(p.n_experts));
      for (float& x : logits) x = 2.0f * n01(rng);
      for (float& x : bias) x = 0.3f * n01(rng);
      const Routed got = run(p, logits, bias), want = reference(p, logits, bias);
      ASSERT_EQ(got.ids, want.ids) << "E=" << p.n_experts << " trial " << trial;
      for (int j = 0; j < p.k; ++j) EXPECT_NEAR(got.weights[size_t(j)], want.weights[size_t(j)], 1e-6f);
    }
  }
}

TEST(GroupedSigmoidRouter, AGroupOutsideTheBestGroupsLosesEvenItsBestExpert) {
  // 8 experts, 4 groups of 2, keep 2 groups, top-2. Expert 6 is the single best, but its group
  // (6, 7) sums lower than groups (0, 1) and (2, 3): it may not be chosen.
  std::vector<float> logits = {2.0f, 2.0f, 1.8f, 1.8f, -3.0f, -3.0f, 4.0f, -4.0f};
  const std::vector<float> bias(8, 0.0f);
  const Routed r = run(grouped(8, 2, 4, 2), logits, bias);
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1}));
  // With every group kept it is.
  EXPECT_EQ(run(grouped(8, 2, 4, 4), logits, bias).ids[0], 6);
}

TEST(GroupedSigmoidRouter, TheBiasSelectsButDoesNotWeigh) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 1.0f};  // lifts expert 3 to the top
  const RouterParams p = grouped(4, 2, 1, 1, /*normalize=*/false);
  const Routed r = run(p, logits, bias);
  EXPECT_EQ(r.ids, (std::vector<int>{3, 0}));
  EXPECT_FLOAT_EQ(r.weights[0], 1.0f / (1.0f + std::exp(0.5f)));  // sigmoid(-0.5): no bias
  EXPECT_FLOAT_EQ(r.weights[1], 1.0f / (1.0f + std::exp(-1.0f)));
}

TEST(GroupedSigmoidRouter, WeightsAreNormalisedThenScaled) {
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 0.7f, -0.2f, 1.1f};
  const Routed r = run(grouped(6, 3, 3, 2, true, 2.5f), logits, std::vector<float>(6, 0.1f));
  EXPECT_NEAR(r.weights[0] + r.weights[1] + r.weights[2], 2.5f, 1e-5f);
  const Routed raw = run(grouped(6, 3, 3, 2, false, 1.0f), logits, std::vector<float>(6, 0.1f));
  EXPECT_EQ(r.ids, raw.ids);
  EXPECT_NEAR(r.weights[1] / r.weights[0], raw.weights[1] / raw.weights[0], 1e-6f);
}

TEST(GroupedSigmoidRouter, TiesGoToTheLowerGroupAndTheLowerId) {
  const std::vector<float> logits(8, 0.25f), bias(8, 0.0f);
  const Routed r = run(grouped(8, 3, 4, 2), logits, bias);
  EXPECT_EQ(r.ids, (std::vector<int>{0, 1, 2}));
}

TEST(GroupedSigmoidRouter, SoftmaxScoringIsRouteTokenScaled) {
  RouterParams p;
  p.n_experts = 5;
  p.k = 2;
  p.normalize = true;
  p.scaling = 2.0f;
  const Routed r = run(p, {0.1f, 0.9f, -0.3f, 0.5f, 0.0f}, {});
  EXPECT_EQ(r.ids, (std::vector<int>{1, 3}));
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.0f, 1e-6f);
}

std::vector<uint8_t> flags(int n, std::initializer_list<int> on) {
  std::vector<uint8_t> r(size_t(n), 0);
  for (int e : on) r[size_t(e)] = 1;
  return r;
}

TEST(GroupedCacheAware, SubstitutesOnlyInsideTheKeptGroupsAndWithinTolerance) {
  // Groups of 2: (0,1) (2,3) (4,5) (6,7); keep 2 groups; top-2 -> groups (0,1) and (2,3).
  const std::vector<float> logits = {3.0f, 1.0f, 0.9f, 0.0f, 2.9f, -5.0f, -5.0f, -5.0f};
  const std::vector<float> bias(8, 0.0f);
  const RouterParams p = grouped(8, 2, 4, 2);
  std::vector<float> scratch(p.scratch_floats());
  Routed r = run(p, logits, bias);
  ASSERT_EQ(r.ids, (std::vector<int>{0, 1}));
  // Expert 4 (a dropped group) is resident and nearly as good as 1: never a candidate. Expert 2
  // (a kept group) is resident and close to 1: it takes slot 1.
  std::vector<int> ids = r.ids;
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), bias.data(), flags(8, {4}), 1.0f, ids.data(), scratch), 0);
  EXPECT_EQ(ids, r.ids);
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), bias.data(), flags(8, {2, 4}), 1.0f, ids.data(), scratch), 1);
  EXPECT_EQ(ids, (std::vector<int>{0, 2}));
  // Tolerance 0 changes nothing, whatever is resident.
  ids = r.ids;
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), bias.data(), flags(8, {2, 3, 4}), 0.0f, ids.data(), scratch), 0);
  EXPECT_EQ(ids, r.ids);
  // A tiny tolerance refuses a candidate far below.
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), bias.data(), flags(8, {3}), 0.01f, ids.data(), scratch), 0);
}

TEST(GroupedCacheAware, RouterRecomputesSigmoidWeightsAndToleranceZeroIsBitwiseIdentical) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const RouterParams p = grouped(16, 4, 4, 2, true, 2.5f);
  const int T = 7;
  std::vector<float> logits(size_t(T) * 16), bias(16);
  for (float& x : logits) x = 2.0f * n01(rng);
  for (float& x : bias) x = 0.3f * n01(rng);
  std::vector<int> ids(size_t(T) * 4);
  std::vector<float> w(size_t(T) * 4), scratch(p.scratch_floats());
  for (int t = 0; t < T; ++t)
    route(p, logits.data() + t * 16, bias.data(), ids.data() + t * 4, w.data() + t * 4, scratch);
  const std::vector<int> ids0 = ids;
  const std::vector<float> w0 = w;
  CacheAwareRouter car(16, 4, true);
  car.set_grouped(p);
  const auto resident = flags(16, {1, 4, 9, 13});
  CacheAwareStats st;
  EXPECT_EQ(car.apply(resident, logits.data(), T, 0.0f, ids.data(), w.data(), st, bias.data()), 0);
  EXPECT_EQ(ids, ids0);
  EXPECT_EQ(0, std::memcmp(w.data(), w0.data(), w.size() * sizeof(float)));
  const int changed = car.apply(resident, logits.data(), T, 10.0f, ids.data(), w.data(), st, bias.data());
  EXPECT_GT(changed, 0);
  for (int t = 0; t < T; ++t) {
    float sum = 0;
    for (int j = 0; j < 4; ++j) sum += w[size_t(t) * 4 + j];
    EXPECT_NEAR(sum, 2.5f, 1e-5f);  // renormalised sigmoid weights, scaled
    std::vector<float> want(4);
    sigmoid_routing_weights(p, logits.data() + t * 16, ids.data() + t * 4, want.data());
    for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(w[size_t(t) * 4 + j], want[size_t(j)]);
  }
}

// DeepSeek-V2's group-limited greedy router (issue 20) against a sort-based definition written from
// transformers' DeepseekV2TopkRouter: softmax (double), group score = the group's best probability,
// the topk_group best groups (stable: lower group first), the k best probabilities among them.
RouterParams softmax_grouped(int E, int k, int G, int topk_group, bool normalize = false, float scaling = 1.0f) {
  RouterParams p = grouped(E, k, G, topk_group, normalize, scaling);
  p.scoring = RouterScoring::kSoftmax;
  return p;
}

Routed softmax_grouped_reference(const RouterParams& p, const std::vector<float>& logits) {
  const int E = p.n_experts, G = p.n_group, per = E / G;
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> pr(static_cast<size_t>(E));
  double z = 0;
  for (int e = 0; e < E; ++e) z += pr[size_t(e)] = std::exp(double(logits[size_t(e)]) - m);
  for (double& v : pr) v /= z;
  std::vector<double> gs(static_cast<size_t>(G), 0.0);
  for (int e = 0; e < E; ++e) gs[size_t(e / per)] = std::max(gs[size_t(e / per)], pr[size_t(e)]);
  Routed r;
  r.ids = best_in_best_groups(p, gs, pr);
  double sum = 0;
  for (int id : r.ids) sum += pr[size_t(id)];
  for (int id : r.ids) r.weights.push_back(float(pr[size_t(id)] / (p.normalize ? sum : 1.0) * p.scaling));
  return r;
}

TEST(GroupLimitedGreedyRouter, MatchesTheSortedDefinitionOnRandomInputs) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const int shapes[][4] = {{12, 3, 4, 2}, {160, 6, 8, 3}, {24, 4, 8, 3}, {30, 5, 3, 2}, {16, 2, 1, 1}, {9, 3, 3, 1}};
  for (const auto& sh : shapes) {
    const RouterParams p = softmax_grouped(sh[0], sh[1], sh[2], sh[3], sh[0] % 3 == 0, 16.0f);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> logits(size_t(p.n_experts));
      for (float& x : logits) x = 3.0f * n01(rng);
      const Routed got = run(p, logits, {}), want = softmax_grouped_reference(p, logits);
      ASSERT_EQ(got.ids, want.ids) << "E=" << p.n_experts << " trial " << trial;
      for (int j = 0; j < p.k; ++j)
        EXPECT_NEAR(got.weights[size_t(j)], want.weights[size_t(j)], 1e-6f * 16.0f) << "E=" << p.n_experts;
    }
  }
}

TEST(GroupLimitedGreedyRouter, AGroupScoresItsBestProbabilityNotItsTwoBest) {
  // Groups of 2: (0,1) has two good experts, (2,3) one excellent and one poor, (4,5) poor. One
  // group kept: the sigmoid router's two-best sum would keep (0,1); the group maximum keeps (2,3).
  const std::vector<float> logits = {2.0f, 2.0f, 2.5f, -6.0f, -1.0f, -1.0f};
  const Routed r = run(softmax_grouped(6, 2, 3, 1), logits, {});
  EXPECT_EQ(r.ids, (std::vector<int>{2, 3}));  // the kept group's experts, even the poor one
  // Two groups kept: (2,3) and (0,1); top-2 over them.
  EXPECT_EQ(run(softmax_grouped(6, 2, 3, 2), logits, {}).ids, (std::vector<int>{2, 0}));
}

TEST(GroupLimitedGreedyRouter, WeightsAreTheProbabilitiesOverAllExpertsScaled) {
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 0.7f, -0.2f, 1.1f};
  const Routed r = run(softmax_grouped(6, 2, 3, 2, false, 2.5f), logits, {});
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  ASSERT_EQ(r.ids, (std::vector<int>{2, 5}));
  EXPECT_NEAR(r.weights[0], 2.5 * std::exp(2.0) / z, 1e-6);  // not renormalised over the top-k
  EXPECT_NEAR(r.weights[1], 2.5 * std::exp(1.1) / z, 1e-6);
  const Routed n = run(softmax_grouped(6, 2, 3, 2, true, 2.5f), logits, {});
  EXPECT_NEAR(n.weights[0] + n.weights[1], 2.5f, 1e-5f);  // norm_topk_prob
  // Ties: the lower group, then the lower id.
  EXPECT_EQ(run(softmax_grouped(8, 3, 4, 2), std::vector<float>(8, 0.5f), {}).ids, (std::vector<int>{0, 1, 2}));
}

// Cache-aware routing for it (docs/cache_aware.md): near-tied on the logits as the plain softmax
// router's, candidates only from the kept groups; weights recomputed as the router's; tolerance 0
// changes no bit.
TEST(GroupLimitedGreedyCacheAware, SubstitutesInsideTheKeptGroupsAndReweighs) {
  const std::vector<float> logits = {3.0f, 1.0f, 0.9f, 0.0f, 2.95f, -5.0f, -5.0f, -5.0f};
  const RouterParams p = softmax_grouped(8, 2, 4, 2, false, 2.0f);
  std::vector<float> scratch(p.scratch_floats());
  const Routed r = run(p, logits, {});
  ASSERT_EQ(r.ids, (std::vector<int>{0, 4}));  // groups (0,1) and (4,5) kept
  std::vector<int> ids = r.ids;
  // Expert 2 (dropped group (2,3)) is resident and within tolerance of 4: never a candidate.
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), nullptr, flags(8, {0, 2}), 100.0f, ids.data(), scratch), 0);
  // Expert 1 (kept group) resident: logit gap 1.95 <= 1.0 * (3.0 - 2.95)? no; with tolerance 40 yes.
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), nullptr, flags(8, {0, 1}), 1.0f, ids.data(), scratch), 0);
  EXPECT_EQ(substitute_resident_grouped(p, logits.data(), nullptr, flags(8, {0, 1}), 40.0f, ids.data(), scratch), 1);
  EXPECT_EQ(ids, (std::vector<int>{0, 1}));

  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const RouterParams q = softmax_grouped(16, 3, 4, 2, false, 16.0f);
  const int T = 9;
  std::vector<float> lg(size_t(T) * 16);
  for (float& x : lg) x = 2.0f * n01(rng);
  std::vector<int> all(size_t(T) * 3);
  std::vector<float> w(all.size()), sc(q.scratch_floats());
  for (int t = 0; t < T; ++t) route(q, lg.data() + t * 16, nullptr, all.data() + t * 3, w.data() + t * 3, sc);
  const std::vector<int> ids0 = all;
  const std::vector<float> w0 = w;
  ASSERT_TRUE(grouped_cache_aware(q));
  CacheAwareRouter car(16, 3, false);
  car.set_grouped(q);
  const auto resident = flags(16, {1, 4, 9, 13, 14});
  CacheAwareStats st;
  EXPECT_EQ(car.apply(resident, lg.data(), T, 0.0f, all.data(), w.data(), st), 0);
  EXPECT_EQ(all, ids0);
  EXPECT_EQ(0, std::memcmp(w.data(), w0.data(), w.size() * sizeof(float)));
  EXPECT_GT(car.apply(resident, lg.data(), T, 10.0f, all.data(), w.data(), st), 0);
  for (int t = 0; t < T; ++t) {
    double z = 0;
    for (int e = 0; e < 16; ++e) z += std::exp(double(lg[size_t(t) * 16 + e]));
    for (int j = 0; j < 3; ++j) {
      const int id = all[size_t(t) * 3 + j];
      EXPECT_NEAR(w[size_t(t) * 3 + j], 16.0 * std::exp(double(lg[size_t(t) * 16 + id])) / z, 1e-4);
    }
  }
}

nlohmann::json base_json() {
  ModelConfig c = make_model_config(Arch::kGlm4Moe, {.vocab = 64, .hidden = 32, .layers = 3, .heads = 4, .kv_heads = 2,
                                                     .head_dim = 8, .expert_width = 16, .experts = 16, .top_k = 4,
                                                     .max_positions = 128},
                                    QkNorm::kPerHead, QuantType::kBF16);
  test::grouped_sigmoid_with_dense_first_layer(c, 16, 40);
  c.rotary_dim = 4;
  return c.to_json();
}

TEST(GlmModelConfig, FieldsRoundTripThroughModelJson) {
  const ModelConfig c = ModelConfig::from_json(base_json(), "model.json");
  EXPECT_EQ(c.arch, Arch::kGlm4Moe);
  EXPECT_EQ(c.router_scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c.shared_expert_gated);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.n_moe_layers(), 2);
  EXPECT_EQ(c.intermediate_size, 40);
  EXPECT_EQ(c.rope_dim(), 4);
  // Other models' model.json carries none of the keys.
  const nlohmann::json plain =
      make_model_config(Arch::kQwen3Moe, {.vocab = 64, .hidden = 32, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 8,
                                          .expert_width = 16, .experts = 8, .top_k = 2, .max_positions = 128},
                        QkNorm::kPerHead, QuantType::kBF16)
          .to_json();
  for (const char* k : {"router_scoring", "n_group", "topk_group", "routed_scaling_factor", "shared_expert_gated",
                        "first_k_dense_replace", "intermediate_size", "rotary_dim"})
    EXPECT_FALSE(plain.contains(k)) << k;
}

TEST(GlmModelConfig, BadGroupingDenseLayersAndRotaryWidthAreNamed) {
  auto expect_bad = [](const char* key, nlohmann::json value, const char* says) {
    nlohmann::json j = base_json();
    j[key] = value;
    try {
      (void)ModelConfig::from_json(j, "m/model.json");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_bad("n_group", 3, "'n_group'");                    // does not divide 16
  expect_bad("topk_group", 5, "'topk_group'");              // > n_group
  expect_bad("n_group", 16, "'n_group'");                   // groups of 1
  expect_bad("first_k_dense_replace", 3, "'first_k_dense_replace'");  // no MoE layer left
  expect_bad("rotary_dim", 5, "'rotary_dim'");              // odd
  expect_bad("rotary_dim", 10, "'rotary_dim'");             // > head_dim
  expect_bad("routed_scaling_factor", -1, "'routed_scaling_factor'");
  expect_bad("router_scoring", "relu", "'router_scoring'");
  nlohmann::json j = base_json();
  j["experts"]["layer_types"] = nlohmann::json::array({{"bf16", "bf16", "bf16"}, {"bf16", "bf16", "bf16"},
                                                       {"bf16", "bf16", "bf16"}});
  j["format_version"] = 2;
  EXPECT_THROW((void)ModelConfig::from_json(j, "m/model.json"), FormatError);  // 3 entries, 2 MoE layers
}

}  // namespace
