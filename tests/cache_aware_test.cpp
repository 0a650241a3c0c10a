// Tests of cache-aware routing: the substitution rule on hand-built logits (weakest first, no
// duplicates, tolerance, k = 1, renormalisation) and the model with real tiers (O_DIRECT + host cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "common/file_util.h"
#include "runtime/model/cache_aware_router.h"
#include "loader/store/engine_expert_store.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/model/routing.h"
#include "runtime/model/sampler.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

std::vector<uint8_t> flags(int n, std::initializer_list<int> on) {
  std::vector<uint8_t> r(size_t(n), 0);
  for (int e : on) r[size_t(e)] = 1;
  return r;
}

// Exact top-k ids (best first) of `logits`, as the model routes.
std::vector<int> top_k(const std::vector<float>& logits, int k) {
  std::vector<int> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k)), probs(logits.size());
  route_token(logits.data(), int(logits.size()), k, true, ids.data(), w.data(), probs.data());
  return ids;
}

TEST(CacheAwareRule, WeakestNonResidentSlotGetsTheBestCandidateFirst) {
  // top-3 = {0, 1, 2} (range 10 - 6 = 4); 1 and 2 are not resident; only 5 is resident.
  std::vector<float> logits = {10, 8, 6, 1, 2, 5.8f};
  std::vector<int> ids = top_k(logits, 3);
  ASSERT_EQ(ids, (std::vector<int>{0, 1, 2}));
  const auto res = flags(6, {0, 5});
  // Both 1 and 2 are within 0.6 * 4 = 2.4 of 5 (gaps 2.2 and 0.2): the weakest slot takes it.
  EXPECT_EQ(substitute_resident(logits.data(), 6, 3, res, 0.6f, ids.data()), 1);
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 5}));
}

TEST(CacheAwareRule, BestResidentCandidateWithinToleranceOnly) {
  std::vector<float> logits = {4, 3, 2, 1.9f, 1.5f, 0};  // top-2 = {0, 1}, range 1
  const auto res = flags(6, {3, 4, 5});
  std::vector<int> ids = top_k(logits, 2);
  // Gap from 1 (logit 3) to the best resident 3 (1.9) is 1.1 > 0.5 * 1: nothing changes.
  EXPECT_EQ(substitute_resident(logits.data(), 6, 2, res, 0.5f, ids.data()), 0);
  EXPECT_EQ(ids, (std::vector<int>{0, 1}));
  // With tolerance 1.2 slot 1 takes 3 (the best resident, not 4); slot 0 (gap 2.1 > 1.2) stays.
  EXPECT_EQ(substitute_resident(logits.data(), 6, 2, res, 1.2f, ids.data()), 1);
  EXPECT_EQ(ids, (std::vector<int>{0, 3}));
}

TEST(CacheAwareRule, ToleranceZeroOrNothingResidentChangesNothing) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(16);
    for (float& x : logits) x = nd(rng);
    std::vector<uint8_t> res(16);
    for (auto& r : res) r = uint8_t(rng() & 1);
    std::vector<int> ids = top_k(logits, 4), orig = ids;
    EXPECT_EQ(substitute_resident(logits.data(), 16, 4, res, 0.0f, ids.data()), 0);
    EXPECT_EQ(ids, orig);
    const std::vector<uint8_t> none(16, 0);
    EXPECT_EQ(substitute_resident(logits.data(), 16, 4, none, 1e6f, ids.data()), 0);
    EXPECT_EQ(ids, orig);
  }
}

TEST(CacheAwareRule, RandomScoresGiveDistinctResidentChoicesWithinTheAllowance) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  int total_changed = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int E = 8 + int(rng() % 40), k = 1 + int(rng() % 8);
    std::vector<float> logits(static_cast<size_t>(E));
    for (float& x : logits) x = nd(rng);
    std::vector<uint8_t> res(static_cast<size_t>(E));
    for (auto& r : res) r = uint8_t(rng() % 3 == 0);
    const float tol = float(rng() % 5) * 0.1f;
    std::vector<int> ids = top_k(logits, k), orig = ids;
    const float range = logits[size_t(orig[0])] - logits[size_t(orig[size_t(k) - 1])];
    const float allow = k == 1 ? tol : tol * range;
    const int changed = substitute_resident(logits.data(), E, k, res, tol, ids.data());
    total_changed += changed;
    EXPECT_EQ(std::set<int>(ids.begin(), ids.end()).size(), size_t(k)) << "duplicate expert";
    int diff = 0;
    for (int j = 0; j < k; ++j) {
      if (ids[size_t(j)] == orig[size_t(j)]) continue;
      ++diff;
      EXPECT_FALSE(res[size_t(orig[size_t(j)])]) << "a resident choice was replaced";
      EXPECT_TRUE(res[size_t(ids[size_t(j)])]) << "replaced by a non-resident expert";
      EXPECT_LE(logits[size_t(orig[size_t(j)])] - logits[size_t(ids[size_t(j)])], allow + 1e-6f);
    }
    EXPECT_EQ(diff, changed);
  }
  EXPECT_GT(total_changed, 100);  // the property checks above did see substitutions
}

TEST(CacheAwareRule, TopOneUsesAnAbsoluteLogitTolerance) {
  std::vector<float> logits = {1.0f, 0.7f, 0.2f};  // k = 1: range 0, so X is absolute
  const auto res = flags(3, {1, 2});
  std::vector<int> ids = {0};
  EXPECT_EQ(substitute_resident(logits.data(), 3, 1, res, 0.25f, ids.data()), 0);
  EXPECT_EQ(substitute_resident(logits.data(), 3, 1, res, 0.35f, ids.data()), 1);
  EXPECT_EQ(ids[0], 1);
}

TEST(CacheAwareRule, KIsClampedToTheNumberOfExperts) {
  std::vector<float> logits = {3, 2};
  std::vector<int> ids = {0, 1, -1};
  const auto res = flags(2, {0});
  // All experts are selected already: nothing to substitute, and no read past ids[1].
  EXPECT_EQ(substitute_resident(logits.data(), 2, 3, res, 10.0f, ids.data()), 0);
  EXPECT_EQ(ids[2], -1);
}

TEST(CacheAwareRule, WeightsAreRenormalisedAsTheArchitectureDoes) {
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 0.25f};
  std::vector<int> ids = {0, 4, 2};  // a substituted selection, not in score order
  std::vector<float> w(3), probs(5);
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  // norm_topk_prob = false (OLMoE): the full-softmax probabilities of the chosen experts.
  routing_weights(logits.data(), 5, ids.data(), 3, false, w.data(), probs.data());
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(w[size_t(j)], std::exp(double(logits[size_t(ids[size_t(j)])])) / z, 1e-6);
  // norm_topk_prob = true (Qwen3) and Mixtral: softmax over the chosen logits alone.
  routing_weights(logits.data(), 5, ids.data(), 3, true, w.data(), probs.data());
  double zk = 0;
  for (int e : ids) zk += std::exp(double(logits[size_t(e)]));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(w[size_t(j)], std::exp(double(logits[size_t(ids[size_t(j)])])) / zk, 1e-6);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
}

TEST(CacheAwareRouter, OneChunkSubstitutesRenormalisesOnlyChangedTokensAndCountsDistinctMisses) {
  // Two tokens, top-2 of 5 experts, one snapshot: only expert 3 is resident.
  const std::vector<float> logits = {4, 3, 1, 2.8f, 0,    // token 0: top-2 {0, 1}, range 1
                                     4, 3, 1, 0.5f, 0};   // token 1: 3 is 2.5 below 1
  const auto res = flags(5, {3});
  std::vector<int> ids = {0, 1, 0, 1};
  std::vector<float> w = {0.7f, 0.3f, 0.6f, 0.4f};  // stand-ins: changed tokens are recomputed
  CacheAwareRouter r(5, 2, true);
  CacheAwareStats st;
  EXPECT_EQ(r.apply(res, logits.data(), 2, 0.5f, ids.data(), w.data(), st), 1);
  EXPECT_EQ(ids, (std::vector<int>{0, 3, 0, 1}));  // token 0: 1 -> 3 (gap 0.2 <= 0.5 * 1)
  const float z = std::exp(4.0f) + std::exp(2.8f);
  EXPECT_NEAR(w[0], std::exp(4.0f) / z, 1e-6);
  EXPECT_NEAR(w[1], std::exp(2.8f) / z, 1e-6);
  EXPECT_EQ(w[2], 0.6f);  // token 1 changed nothing: its weights are left as they came
  EXPECT_EQ(w[3], 0.4f);
  EXPECT_EQ(st.layer_chunks, 1u);
  EXPECT_EQ(st.routings, 2u);
  EXPECT_EQ(st.slots, 4u);
  EXPECT_EQ(st.substitutions, 1u);
  EXPECT_EQ(st.slots_unchanged, 3u);
  EXPECT_EQ(st.misses_before, 2u);  // 0 and 1, each once for the chunk
  EXPECT_EQ(st.misses_after, 2u);   // token 1 still reads both
  // A second chunk adds to the counters; tolerance 0 changes nothing.
  std::vector<int> ids2 = {0, 1};
  EXPECT_EQ(r.apply(res, logits.data(), 1, 0.0f, ids2.data(), w.data(), st), 0);
  EXPECT_EQ(ids2, (std::vector<int>{0, 1}));
  EXPECT_EQ(st.layer_chunks, 2u);
  EXPECT_EQ(st.misses_before, 4u);
  EXPECT_EQ(st.misses_after, 4u);
}

ModelConfig small_config() {
  return test::tiny_moe_config({.layers = 3, .experts = 16, .top_k = 4, .max_positions = 256});
}

// A model on the engine store with O_DIRECT and a host cache holding 40% of the experts, so
// residency comes from the real tiers and changes as the cache fills and evicts.
std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const CacheAwareOptions& ca,
                                  bool host_cache = true) {
  const ModelConfig cfg = ModelConfig::load(dir);
  EngineExpertStoreOptions so;
  so.io.direct = true;
  const size_t slot = test::expert_slot_bytes(cfg);
  so.host_cache_bytes = host_cache ? slot * size_t(cfg.n_layers * cfg.n_experts) * 2 / 5 : 0;
  ModelOptions mo;
  mo.n_threads = 2;
  mo.cache_aware = ca;
  return Model::load(dir, mo, open_expert_store("auto", dir, cfg, so));
}

struct GenRun {
  std::vector<int> tokens;
  GenerateStats stats;
};

GenRun run(Model& m, const std::vector<int>& prompt, uint64_t seed, int n) {
  SamplerParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.seed = seed;
  Sampler s(sp);
  GenerateOptions go;
  go.n_new = n;
  GenRun r;
  r.stats = generate(m, prompt, go, s, nullptr, &r.tokens);
  return r;
}

// Cache-aware routing at tolerance 0 keeps every token of sampled runs from random prompts
// (rng_seed) on the model in `dir`, counting routings and substituting nothing; a wide tolerance
// (0.5) does substitute, here, with these caches, and changes some tokens: the comparison means
// something.
void expect_tolerance_zero_keeps_every_token(const std::filesystem::path& dir, uint32_t rng_seed) {
  auto off = load_model(dir, {false, 0.0f});
  auto zero = load_model(dir, {true, 0.0f});
  auto wide = load_model(dir, {true, 0.5f});
  std::mt19937 rng(rng_seed);
  int differing = 0;
  uint64_t wide_subs = 0;
  for (int i = 0; i < 12; ++i) {
    std::vector<int> prompt(size_t(1 + rng() % 20));
    for (int& t : prompt) t = int(rng() % 61);
    const uint64_t seed = rng();
    const GenRun a = run(*off, prompt, seed, 24), b = run(*zero, prompt, seed, 24);
    EXPECT_EQ(a.tokens, b.tokens) << "prompt " << i << " seed " << seed;
    EXPECT_EQ(b.stats.decode.routing.substitutions, 0u);
    EXPECT_EQ(b.stats.decode.routing.agreement(), 1.0);
    EXPECT_GT(b.stats.decode.routing.routings, 0u);
    const GenRun c = run(*wide, prompt, seed, 24);
    wide_subs += c.stats.decode.routing.substitutions + c.stats.prefill.routing.substitutions;
    differing += c.tokens != a.tokens;
  }
  EXPECT_GT(wide_subs, 0u);
  EXPECT_GT(differing, 0);
}

class CacheAwareModel : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_model(dir_.path(), small_config(), 99, 2); }
  TempDir dir_{"cacheaware"};
};

TEST_F(CacheAwareModel, ToleranceZeroGivesTheSameTokensAsCacheAwareOff) {
  expect_tolerance_zero_keeps_every_token(dir_.path(), 5);
}

// GLM-4.5's grouped sigmoid router (docs/cache_aware.md): tolerance 0 keeps every token of every
// run; a wide tolerance substitutes (inside the kept groups) and changes some.
TEST(CacheAwareGlm, ToleranceZeroGivesTheSameTokensAsCacheAwareOff) {
  TempDir dir("cacheaware_glm");
  ModelConfig c = small_config();
  c.arch = Arch::kGlm4Moe;
  test::grouped_sigmoid_with_dense_first_layer(c, 32, 40);
  write_synthetic_model(dir.path(), c, 99, 2);
  expect_tolerance_zero_keeps_every_token(dir.path(), 6);
}

TEST_F(CacheAwareModel, NothingResidentMeansNothingSubstituted) {
  // O_DIRECT and no host cache: every expert is on storage at every step.
  auto off = load_model(dir_.path(), {false, 0.0f}, false);
  auto huge = load_model(dir_.path(), {true, 1e6f}, false);
  const std::vector<int> prompt = {3, 14, 15, 9, 26};
  const GenRun a = run(*off, prompt, 7, 16), b = run(*huge, prompt, 7, 16);
  EXPECT_EQ(a.tokens, b.tokens);
  const CacheAwareStats& r = b.stats.decode.routing;
  EXPECT_EQ(r.substitutions + b.stats.prefill.routing.substitutions, 0u);
  EXPECT_EQ(r.misses_before, r.misses_after);
  EXPECT_GT(r.misses_before, 0u);
}

TEST_F(CacheAwareModel, DecodeMissCountsMatchTheStoreReads) {
  for (float tol : {0.0f, 0.3f, 1.0f}) {
    auto m = load_model(dir_.path(), {true, tol});
    const GenRun r = run(*m, {1, 2, 3, 4, 5, 6, 7, 8}, 11, 40);
    const CacheAwareStats& ca = r.stats.decode.routing;
    // Residency is what the store really holds: each predicted miss is one expert read.
    EXPECT_EQ(ca.misses_after, r.stats.experts.experts_read - r.stats.experts_after_prefill.experts_read)
        << "tolerance " << tol;
    EXPECT_LE(ca.misses_after, ca.misses_before);
    if (tol == 0.0f) {
      EXPECT_EQ(ca.misses_after, ca.misses_before);
    }
  }
}

TEST_F(CacheAwareModel, OptionsCanChangeBetweenCallsOnOneModel) {
  auto m = load_model(dir_.path(), {false, 0.1f});
  EXPECT_FALSE(m->cache_aware().enabled);
  const GenRun a = run(*m, {5, 6, 7}, 3, 12);
  EXPECT_EQ(a.stats.decode.routing.routings, 0u);  // off: no counters
  m->set_cache_aware({true, 0.0f});
  const GenRun b = run(*m, {5, 6, 7}, 3, 12);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.stats.decode.routing.routings, uint64_t(b.stats.decode.tokens) * 3u);
}

}  // namespace

// Issue 22 item 3: cache-aware routing over a batch of sequences (Model::forward_batch) takes one
// residency snapshot per layer for the whole step, counts the distinct misses of the union of
// every sequence's choices, and those are exactly the experts the step reads (O_DIRECT, host
// cache: a resident expert is never read, a missing one once however many sequences chose it).
TEST_F(CacheAwareModel, ABatchStepRoutesAgainstOneSnapshotAndReadsTheUnionsMissesOnce) {
  auto m = load_model(dir_.path(), {true, 0.5f});
  const int layers = m->config().n_moe_layers(), n = 3;
  std::vector<int> seqs;
  std::vector<std::vector<int>> prompts = {{3, 9, 27}, {50, 1}, {12, 33, 7, 60}};
  std::vector<std::vector<float>> logits(n, std::vector<float>(size_t(m->config().vocab_size)));
  for (int i = 0; i < n; ++i) {  // prefill each alone: the host cache fills with their experts
    seqs.push_back(m->create_sequence());
    const SequenceInput in{seqs.back(), prompts[size_t(i)], logits[size_t(i)]};
    m->forward_batch(std::span<const SequenceInput>(&in, 1));
  }
  uint64_t subs = 0;
  for (int step = 0; step < 6; ++step) {
    std::vector<int> next(n);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < n; ++i) {
      next[size_t(i)] = int(std::max_element(logits[size_t(i)].begin(), logits[size_t(i)].end()) -
                            logits[size_t(i)].begin());
      batch.push_back({seqs[size_t(i)], std::span<const int>(&next[size_t(i)], 1), logits[size_t(i)]});
    }
    m->reset_cache_aware_stats();
    const uint64_t read0 = m->expert_stats().experts_read;
    m->forward_batch(batch);
    const CacheAwareStats& st = m->cache_aware_stats();
    EXPECT_EQ(st.layer_chunks, uint64_t(layers)) << "one snapshot per layer, not one per sequence";
    EXPECT_EQ(st.routings, uint64_t(n * layers));
    EXPECT_LE(st.misses_after, st.misses_before);
    EXPECT_EQ(m->expert_stats().experts_read - read0, st.misses_after) << "step " << step;
    subs += st.substitutions;
  }
  EXPECT_GT(subs, 0u);  // the tolerance is wide enough to substitute here: the checks mean something
}
