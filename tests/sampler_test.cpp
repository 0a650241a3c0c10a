// Sampler (runtime/model/sampler.h) against a plain reference written here: the whole vocabulary
// sorted in double, each step of the documented order applied literally. Exact checks where the
// choice is deterministic (greedy, penalties, bans, logprobs), empirical frequencies over seeded
// draws (within 4 standard deviations) where it is random.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/error.h"
#include "runtime/model/sampler.h"
#include "tests/support/argmax_reference.h"

namespace moestream {
namespace {

// Steps 1-3 of the documented order: bias, repeat penalty over the window's distinct tokens
// (history = prompt then output), presence/frequency over the output only.
std::vector<double> reference_adjusted(const std::vector<float>& logits, const SamplerParams& p,
                                       const std::vector<int>& prompt, const std::vector<int>& output) {
  std::vector<double> l(logits.begin(), logits.end());
  for (const LogitBias& b : p.logit_bias) l[size_t(b.id)] = b.bias == -100 ? -INFINITY : l[size_t(b.id)] + b.bias;
  std::vector<int> history = prompt;
  history.insert(history.end(), output.begin(), output.end());
  if (p.repeat_last_n >= 0 && history.size() > size_t(p.repeat_last_n))
    history.erase(history.begin(), history.end() - p.repeat_last_n);
  std::sort(history.begin(), history.end());
  history.erase(std::unique(history.begin(), history.end()), history.end());
  for (int id : history) {
    // In float, as llama.cpp: the same rounding as the sampler's.
    const float x = float(l[size_t(id)]);
    l[size_t(id)] = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
  }
  std::map<int, int> count;
  for (int id : output) ++count[id];
  for (const auto& [id, n] : count)
    l[size_t(id)] = float(l[size_t(id)]) - (p.frequency_penalty * float(n) + p.presence_penalty);
  return l;
}

// The final distribution of step 6 (temperature > 0): id -> probability.
std::map<int, double> reference_distribution(const std::vector<float>& logits, const SamplerParams& p,
                                             const std::vector<int>& prompt = {}, const std::vector<int>& output = {}) {
  const std::vector<double> l = reference_adjusted(logits, p, prompt, output);
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
  std::vector<std::pair<int, double>> kept;  // most likely first
  for (int id : order) kept.push_back({id, std::exp((l[size_t(id)] - l[size_t(order[0])]) / p.temperature)});
  const auto normalise = [&] {
    double z = 0;
    for (auto& [id, w] : kept) z += w;
    for (auto& [id, w] : kept) w /= z;
  };
  const auto smallest_prefix = [&](double mass) {
    double cum = 0;
    for (size_t i = 0; i < kept.size(); ++i)
      if ((cum += kept[i].second) >= mass) return kept.resize(i + 1);
  };
  normalise();
  if (p.top_k > 0 && size_t(p.top_k) < kept.size()) kept.resize(size_t(p.top_k)), normalise();
  if (p.top_p < 1) smallest_prefix(p.top_p), normalise();
  if (p.min_p > 0) {
    const double floor = p.min_p * kept[0].second;
    std::erase_if(kept, [&](const auto& c) { return c.second < floor; });
    normalise();
  }
  if (p.typical_p < 1) {
    double h = 0;
    for (auto& [id, q] : kept) h -= q > 0 ? q * std::log(q) : 0;
    std::stable_sort(kept.begin(), kept.end(), [&](const auto& a, const auto& b) {
      return std::abs(-std::log(a.second) - h) < std::abs(-std::log(b.second) - h);
    });
    smallest_prefix(p.typical_p), normalise();
  }
  return std::map<int, double>(kept.begin(), kept.end());
}

std::vector<float> normal_logits(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> l(n);
  for (float& x : l) x = normal(rng);
  return l;
}

// Draws from fresh samplers (seeds 1..draws), each primed with `prompt`, and checks every draw
// is in the reference's support and every frequency is within 4 sigma of its probability.
void expect_frequencies(const std::vector<float>& l, SamplerParams p, const std::vector<int>& prompt, int draws) {
  const std::map<int, double> want = reference_distribution(l, p, prompt);
  std::map<int, int> seen;
  for (int i = 0; i < draws; ++i) {
    p.seed = uint64_t(i) + 1;
    Sampler s(p);
    s.add_prompt(prompt);
    const int id = s.sample(l);
    ASSERT_TRUE(want.count(id)) << "token " << id << " is outside the reference's support";
    ++seen[id];
  }
  for (const auto& [id, q] : want)
    EXPECT_NEAR(double(seen[id]) / draws, q, 4 * std::sqrt(q * (1 - q) / draws) + 1e-3) << "token " << id;
}

SamplerParams plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1;
  return p;
}

// Every step of the order switched on (the bias is each test's).
SamplerParams every_step() {
  SamplerParams p = plain(0.8f);
  p.top_k = 400;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.typical_p = 0.9f;
  p.repeat_penalty = 1.3f;
  p.repeat_last_n = 8;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  return p;
}

TEST(Sampler, MinPKeepsTokensAboveAFractionOfTheMostLikely) {
  const std::vector<float> l = normal_logits(300, 5, 1.5f);
  SamplerParams p = plain(0.9f);
  p.min_p = 0.08f;
  const size_t support = reference_distribution(l, p).size();
  ASSERT_GT(support, 5u);
  ASSERT_LT(support, 150u);  // the filter removes most of the vocabulary
  expect_frequencies(l, p, {}, 30000);
}

TEST(Sampler, TypicalPKeepsTheTokensNearestTheEntropy) {
  const std::vector<float> l = normal_logits(200, 6, 2.0f);
  SamplerParams p = plain(1.0f);
  p.typical_p = 0.5f;
  const std::map<int, double> want = reference_distribution(l, p);
  ASSERT_GT(want.size(), 5u);
  ASSERT_LT(want.size(), 100u);
  // Typical sampling may drop the most likely token, which no likelihood-ordered filter does.
  const int top = Sampler::argmax(l);
  EXPECT_EQ(want.count(top), 0u) << "this fixture should exercise the entropy order";
  expect_frequencies(l, p, {}, 30000);
}

TEST(Sampler, AllFiltersInTheDocumentedOrder) {
  const std::vector<float> l = normal_logits(2000, 7, 1.7f);
  SamplerParams p = every_step();
  p.logit_bias = {{1, 2.5f}, {int(Sampler::argmax(l)), -100.0f}, {17, -1.0f}};
  std::vector<int> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back(int(std::max_element(l.begin(), l.end()) - l.begin()) + i % 3);
  for (int i = 0; i < 6; ++i) prompt.push_back(i * 5);  // the last 8: these and two of the others
  EXPECT_GT(reference_distribution(l, p, prompt).size(), 20u);
  expect_frequencies(l, p, prompt, 40000);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogitsInItsWindow) {
  SamplerParams p = plain(0);
  p.repeat_penalty = 1.2f;
  p.repeat_last_n = 2;
  {
    Sampler s(p);  // 2.0 / 1.2 = 1.67 < 1.9
    s.add_prompt(std::vector<int>{0});
    EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -1.0f}), 1);
  }
  {
    Sampler s(p);  // -1.0 * 1.2 = -1.2 < -1.1
    s.add_prompt(std::vector<int>{0, 0, 0});  // distinct tokens: penalised once, not three times
    EXPECT_EQ(s.sample(std::vector<float>{-1.0f, -1.1f, -5.0f}), 1);
    Sampler t(p);
    t.add_prompt(std::vector<int>{0, 0, 0});
    EXPECT_EQ(t.sample(std::vector<float>{-1.0f, -1.3f, -5.0f}), 0);  // -1.2 > -1.3: once only
  }
  {
    Sampler s(p);  // token 0 left the window of 2
    s.add_prompt(std::vector<int>{0, 2, 2});
    EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -1.0f}), 0);
  }
  p.repeat_last_n = 0;  // off
  Sampler off(p);
  off.add_prompt(std::vector<int>{0});
  EXPECT_TRUE(off.greedy());
  EXPECT_EQ(off.sample(std::vector<float>{2.0f, 1.9f, -1.0f}), 0);
}

// Runs of n tokens (greedy: against the reference step by step): the penalties follow the generated tokens.
std::vector<int> run_tokens(const std::vector<float>& l, const SamplerParams& p, const std::vector<int>& prompt, int n) {
  Sampler s(p);
  s.add_prompt(prompt);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(l));
  return out;
}
std::vector<int> reference_run_tokens(const std::vector<float>& l, const SamplerParams& p,
                                      const std::vector<int>& prompt, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> a = reference_adjusted(l, p, prompt, out);
    out.push_back(int(std::max_element(a.begin(), a.end()) - a.begin()));
  }
  return out;
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> l = normal_logits(64, 8, 1.0f);
  std::vector<int> prompt(10, Sampler::argmax(l));  // not counted by these penalties
  SamplerParams p = plain(0);
  p.frequency_penalty = 0.15f;
  const std::vector<int> freq = run_tokens(l, p, prompt, 40);
  EXPECT_EQ(freq, reference_run_tokens(l, p, prompt, 40));
  EXPECT_EQ(freq[0], Sampler::argmax(l));
  EXPECT_GT(std::set<int>(freq.begin(), freq.end()).size(), 3u);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.5f;
  const std::vector<int> pres = run_tokens(l, p, prompt, 40);
  EXPECT_EQ(pres, reference_run_tokens(l, p, prompt, 40));
  EXPECT_NE(pres, freq);
  p.presence_penalty = -2.0f;  // negative: a token once chosen is favoured
  const std::vector<int> sticky = run_tokens(l, p, prompt, 10);
  EXPECT_EQ(sticky, std::vector<int>(10, Sampler::argmax(l)));
  // The repeat penalty counts the prompt (and combines with the others).
  p.presence_penalty = 0.3f;
  p.repeat_penalty = 1.5f;
  p.repeat_last_n = -1;
  EXPECT_EQ(run_tokens(l, p, prompt, 40), reference_run_tokens(l, p, prompt, 40));
  EXPECT_NE(run_tokens(l, p, prompt, 1)[0], Sampler::argmax(l));
}

TEST(Sampler, LogitBiasShiftsAndBans) {
  const std::vector<float> l{3.0f, 1.0f, 0.5f, -2.0f};
  SamplerParams p = plain(0);
  p.logit_bias = {{0, -100.0f}};
  Sampler ban(p);
  EXPECT_FALSE(ban.greedy());
  EXPECT_EQ(ban.sample(l), 1);
  p.logit_bias = {{3, 5.5f}};  // -2 + 5.5 = 3.5 > 3
  EXPECT_EQ(Sampler(p).sample(l), 3);
  // Sampled: the bias adds to the logit, so odds change by exp(bias / T).
  SamplerParams q = plain(1.5f);
  q.logit_bias = {{2, 1.25f}, {0, -100.0f}};
  expect_frequencies(l, q, {}, 30000);
  // A ban holds however large the logit is; banning all is an error, as is an id past the vocabulary.
  SamplerParams all = plain(1.0f);
  all.logit_bias = {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}, {3, -100.0f}};
  EXPECT_THROW(Sampler(all).sample(l), ConfigError);
  all.temperature = 0;  // greedy too: never a banned token
  EXPECT_THROW(Sampler(all).sample(l), ConfigError);
  all.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(Sampler(all).sample(l), ConfigError);
  std::vector<float> huge = l;
  huge[0] = 1e30f;
  p.logit_bias = {{0, -100.0f}};
  for (float t : {0.0f, 1.0f}) {
    p.temperature = t;
    Sampler s(p);
    for (int i = 0; i < 50; ++i) EXPECT_NE(s.sample(huge), 0);
  }
}

// Logits with no finite value (a broken model) are an error naming the model, not logit_bias,
// at any temperature; the server fails that request alone (BatchScheduler::step).
TEST(Sampler, NoFiniteLogitIsAnErrorNamingTheModelNotTheBias) {
  const std::vector<float> nan(4, std::nanf(""));
  for (float t : {0.0f, 1.0f}) {
    try {
      Sampler(plain(t)).sample(nan);
      ADD_FAILURE() << "no error at temperature " << t;
    } catch (const ConfigError& e) {
      ADD_FAILURE() << "blamed the request: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no finite value"), std::string::npos) << e.what();
    }
  }
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  std::vector<float> l = normal_logits(1500, 9, 3.0f);
  l[100] = l[200] = *std::max_element(l.begin(), l.end()) + 1;  // a tie at the top: lower id first
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  for (int id : {0, 100, 200, 777}) {
    const TokenLogprobs lp = Sampler::logprobs(l, id, 5);
    EXPECT_NEAR(lp.logprob, double(l[size_t(id)]) - std::log(z), 1e-4) << id;
    ASSERT_EQ(lp.top.size(), 5u);
    std::vector<int> order(l.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(lp.top[i].id, order[i]);
      EXPECT_NEAR(lp.top[i].logprob, double(l[size_t(order[i])]) - std::log(z), 1e-4);
    }
  }
  EXPECT_TRUE(Sampler::logprobs(l, 3, 0).top.empty());
  EXPECT_EQ(Sampler::logprobs(std::vector<float>{1.0f, 2.0f}, 0, 20).top.size(), 2u);
}

TEST(Sampler, SeedReproducesEveryFilterAndPenalty) {
  const std::vector<float> l = normal_logits(500, 10, 1.0f);
  SamplerParams p = every_step();
  p.logit_bias = {{3, 2.0f}};
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    return run_tokens(l, p, {1, 2, 3}, 64);
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, RejectsOutOfRangeNewParameters) {
  const auto rejects = [](auto set) {
    SamplerParams p;
    set(p);
    EXPECT_THROW(Sampler{p}, ConfigError);
  };
  rejects([](SamplerParams& p) { p.min_p = -0.1f; });
  rejects([](SamplerParams& p) { p.min_p = 1.5f; });
  rejects([](SamplerParams& p) { p.typical_p = 0; });
  rejects([](SamplerParams& p) { p.repeat_penalty = 0; });
  rejects([](SamplerParams& p) { p.repeat_penalty = NAN; });
  rejects([](SamplerParams& p) { p.repeat_last_n = -2; });
  rejects([](SamplerParams& p) { p.presence_penalty = INFINITY; });
  rejects([](SamplerParams& p) { p.frequency_penalty = NAN; });
  rejects([](SamplerParams& p) { p.logit_bias = {{-1, 1.0f}}; });
  rejects([](SamplerParams& p) { p.logit_bias = {{1, 100.5f}}; });
}

TEST(Sampler, ZeroTemperatureIsArgmax) {
  std::vector<float> l{0.1f, 3.0f, -2.0f, 2.9f};
  Sampler s(SamplerParams{0.0f, 0, 1.0f, 5});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, ArgmaxTakesTheFirstOfTheLargestAndSkipsNaN) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (size_t n : {1u, 15u, 16u, 17u, 1023u, 1024u, 1025u, 5000u, 151936u}) {
    SCOPED_TRACE(n);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    EXPECT_EQ(Sampler::argmax(v), test::argmax_reference(v));
    // A tie of the maximum in a later block, in the same block and at the very end.
    const int first = test::argmax_reference(v);
    for (size_t at : {n - 1, size_t(first) / 2, std::min(n - 1, size_t(first) + 1024)}) {
      std::vector<float> t = v;
      t[at] = t[size_t(first)];
      EXPECT_EQ(Sampler::argmax(t), std::min(int(at), first));
    }
    std::vector<float> nan = v;  // NaN first, and beside the maximum
    nan[0] = NAN;
    if (n > 1) nan[size_t(first) == n - 1 ? n - 2 : size_t(first) + 1] = NAN;
    EXPECT_EQ(Sampler::argmax(nan), test::argmax_reference(nan));
  }
  const float inf = INFINITY;
  EXPECT_EQ(Sampler::argmax(std::vector<float>{NAN, -inf, -inf}), 1);
  EXPECT_EQ(Sampler::argmax(std::vector<float>{NAN, NAN}), 0);
  EXPECT_EQ(Sampler::argmax(std::vector<float>(3000, -inf)), 0);
  std::vector<float> late(3000, -inf);
  late[2500] = inf;
  late[2999] = inf;
  EXPECT_EQ(Sampler::argmax(late), 2500);
}

TEST(Sampler, SameSeedSameSequenceOtherSeedDiffers) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i))) * 2;
  auto draw = [&](uint64_t seed) {
    Sampler s(SamplerParams{1.0f, 0, 1.0f, seed});
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l));
    return out;
  };
  EXPECT_EQ(draw(123), draw(123));
  EXPECT_NE(draw(123), draw(124));
}

TEST(Sampler, TopKAndTopPRestrictTheCandidates) {
  std::vector<float> l{1.0f, 4.0f, 3.0f, 0.0f, 3.5f};
  Sampler k2(SamplerParams{1.0f, 2, 1.0f, 1});
  Sampler p(SamplerParams{1.0f, 0, 0.45f, 2});  // token 1 alone holds 49%
  for (int i = 0; i < 200; ++i) {
    int a = k2.sample(l);
    EXPECT_TRUE(a == 1 || a == 4) << a;
    EXPECT_EQ(p.sample(l), 1);
  }
}

TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  std::vector<float> l{0.0f, 1.0f, 2.0f};
  const float temp = 2.0f;
  Sampler s(SamplerParams{temp, 0, 1.0f, 99});
  std::vector<int> n(3, 0);
  const int draws = 30000;
  for (int i = 0; i < draws; ++i) ++n[size_t(s.sample(l))];
  double z = 0;
  for (float x : l) z += std::exp(x / temp);
  for (size_t i = 0; i < 3; ++i) {
    const double p = std::exp(l[i] / temp) / z;
    EXPECT_NEAR(double(n[i]) / draws, p, 0.015) << "token " << i;
  }
}

TEST(Sampler, TopPOverTheWholeVocabularyDrawsFromItsNucleus) {
  // Without top-k the nucleus is found by selection, not a sort: the same set as the sorted
  // prefix, each member drawn in proportion to its weight.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> l(3000);
  for (float& x : l) x = normal(rng);
  const float top_p = 0.3f;
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
  const float top = l[size_t(order[0])];
  double total = 0;
  for (float x : l) total += std::exp(double(x) - top);
  std::map<int, double> nucleus;  // id -> weight
  double cum = 0;
  for (int id : order) {
    nucleus[id] = std::exp(double(l[size_t(id)]) - top);
    cum += nucleus[id];
    if (cum >= top_p * total) break;
  }
  ASSERT_GT(nucleus.size(), 20u);
  Sampler s(SamplerParams{1.0f, 0, top_p, 11});
  std::map<int, int> seen;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) {
    const int id = s.sample(l);
    ASSERT_TRUE(nucleus.count(id)) << "token " << id << " is outside the nucleus";
    ++seen[id];
  }
  for (const auto& [id, w] : nucleus) {
    const double p = w / cum, f = double(seen[id]) / draws;
    EXPECT_NEAR(f, p, 4 * std::sqrt(p * (1 - p) / draws) + 1e-3) << "token " << id;
  }
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  EXPECT_THROW(Sampler(SamplerParams{-1.0f, 0, 1.0f, 0}), ConfigError);
  EXPECT_THROW(Sampler(SamplerParams{1.0f, -3, 1.0f, 0}), ConfigError);
  EXPECT_THROW(Sampler(SamplerParams{1.0f, 0, 0.0f, 0}), ConfigError);
}

}  // namespace
}  // namespace moestream
