// Tests of cache-aware routing's union rule over a batch of sequences (CacheAwareOptions::batch_union,
// moestream-server --cache-aware-union; docs/cache_aware.md "Batches: the union rule"): later
// sequences of a step see earlier ones' choices as resident, never their own; one sequence alone
// routes exactly as without it; tolerance 0 is bitwise the plain batch; the step reads what the
// counters say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "common/file_util.h"
#include "loader/store/engine_expert_store.h"
#include "common/error.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/model/cache_aware_router.h"
#include "runtime/model/routing.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

std::vector<int> exact_top_k(const std::vector<float>& logits, int E, int K) {
  const int T = int(logits.size()) / E;
  std::vector<int> ids(size_t(T * K));
  std::vector<float> w(static_cast<size_t>(K)), probs(static_cast<size_t>(E));
  for (int t = 0; t < T; ++t)
    route_token(logits.data() + size_t(t) * E, E, K, true, ids.data() + size_t(t) * K, w.data(), probs.data());
  return ids;
}

TEST(CacheAwareUnionRule, LaterSequencesSeeEarlierChoicesButNeverTheirOwn) {
  // 6 experts, top-2, nothing resident. Sequence 0 = row 0; sequence 1 = rows 1 and 2.
  const int E = 6, K = 2;
  const std::vector<float> logits = {
      5, 4, 0, 0, 0, 0,                // row 0: {0, 1}
      0, 3.9f, 5, 4, 0, 0,             // row 1: {2, 3}, range 1; 1 (from sequence 0) is 0.1 below 3
      3.8f, 0, 3.99f, 3.95f, 5, 4};    // row 2: {4, 5}; 2 and 3 (its own sequence's) are closer than 0
  const std::vector<uint8_t> none(size_t(E), 0);
  const std::vector<int> splits = {0, 1, 3};
  std::vector<int> ids = exact_top_k(logits, E, K);
  std::vector<float> w(ids.size(), 0.5f);
  CacheAwareRouter r(E, K, true);
  CacheAwareStats st;
  EXPECT_EQ(r.apply(none, logits.data(), 3, 0.5f, ids.data(), w.data(), st, nullptr, splits), 2);
  // Row 1: 3 -> 1 (chosen by sequence 0). Row 2: 5 -> 0 (sequence 0's), not 2 or 3 (row 1's:
  // its own sequence, whose choices are not read "for it" by anyone else).
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 1, 4, 0}));
  EXPECT_EQ(st.misses_before, 6u);  // 0..5, each non-resident once
  EXPECT_EQ(st.misses_after, 4u);   // {0, 1, 2, 4}: the step's reads
  EXPECT_EQ(st.substitutions, 2u);
  // Sequence 0 came first: it saw nothing of sequence 1, so its row is the exact top-k.
  // Without the union (no splits, or one sequence) nothing is resident: nothing changes.
  for (const std::vector<int>& s : {std::vector<int>{}, std::vector<int>{0, 3}}) {
    std::vector<int> plain = exact_top_k(logits, E, K);
    EXPECT_EQ(r.apply(none, logits.data(), 3, 0.5f, plain.data(), w.data(), st, nullptr, s), 0);
    EXPECT_EQ(plain, exact_top_k(logits, E, K));
  }
  // Tolerance 0 never substitutes, union or not.
  std::vector<int> zero = exact_top_k(logits, E, K);
  EXPECT_EQ(r.apply(none, logits.data(), 3, 0.0f, zero.data(), w.data(), st, nullptr, splits), 0);
  EXPECT_EQ(zero, exact_top_k(logits, E, K));
}

TEST(CacheAwareUnionRule, OneSequenceIsExactlyTheChunkWithoutSplits) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-2, 2);
  const int E = 17, K = 4, T = 9;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(size_t(T * E));
    for (float& x : logits) x = u(rng);
    std::vector<uint8_t> res(static_cast<size_t>(E));
    for (auto& f : res) f = uint8_t(rng() % 3 == 0);
    std::vector<int> a = exact_top_k(logits, E, K), b = a;
    std::vector<float> wa(a.size(), 0.25f), wb = wa;
    CacheAwareRouter r(E, K, true);
    CacheAwareStats sa, sb;
    const std::vector<int> one = {0, T};
    EXPECT_EQ(r.apply(res, logits.data(), T, 0.4f, a.data(), wa.data(), sa),
              r.apply(res, logits.data(), T, 0.4f, b.data(), wb.data(), sb, nullptr, one));
    EXPECT_EQ(a, b);
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);
    EXPECT_EQ(sa.misses_after, sb.misses_after);
  }
}

// Models on the engine store with O_DIRECT, with a host cache of 40% of the experts or none.
ModelConfig small_config() {
  return test::tiny_moe_config({.layers = 3, .experts = 16, .top_k = 4, .max_positions = 256});
}

std::unique_ptr<Model> load_model(const std::filesystem::path& dir, const CacheAwareOptions& ca, bool host_cache,
                                  int max_batch = 64) {
  const ModelConfig cfg = ModelConfig::load(dir);
  EngineExpertStoreOptions so;
  so.io.direct = true;
  so.host_cache_bytes = host_cache ? test::expert_slot_bytes(cfg) * size_t(cfg.n_layers * cfg.n_experts) * 2 / 5 : 0;
  ModelOptions mo;
  mo.n_threads = 2;
  mo.max_sequences = 4;
  mo.max_batch = max_batch;
  mo.cache_aware = ca;
  return Model::load(dir, mo, open_expert_store("auto", dir, cfg, so));
}

CacheAwareOptions union_at(float tolerance) {
  CacheAwareOptions o{true, tolerance};
  o.batch_union = true;
  return o;
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// Three greedy sequences in one batch: their prompts in one step, then `steps` decode steps of
// all three. Returns every logits vector in order; reads and substitutions summed into the outs.
std::vector<std::vector<float>> run_batch(Model& m, int steps, uint64_t* reads = nullptr, uint64_t* subs = nullptr,
                                          uint64_t* misses = nullptr) {
  const std::vector<std::vector<int>> prompts = {{3, 9, 27, 4}, {50, 1}, {12, 33, 7, 60, 2}};
  const size_t V = size_t(m.config().vocab_size), n = prompts.size();
  std::vector<std::vector<float>> l(n, std::vector<float>(V)), all;
  std::vector<int> seqs, next(n);
  for (size_t i = 0; i < n; ++i) seqs.push_back(m.create_sequence());
  m.reset_cache_aware_stats();
  const uint64_t r0 = m.expert_stats().experts_read;
  for (int step = 0; step <= steps; ++step) {
    std::vector<SequenceInput> batch;
    for (size_t i = 0; i < n; ++i) {
      if (step > 0) next[i] = argmax(l[i]);
      batch.push_back({seqs[i], step == 0 ? std::span<const int>(prompts[i]) : std::span<const int>(&next[i], 1), l[i]});
    }
    m.forward_batch(batch);
    for (auto& x : l) all.push_back(x);
  }
  if (reads) *reads = m.expert_stats().experts_read - r0;
  if (subs) *subs = m.cache_aware_stats().substitutions;
  if (misses) *misses = m.cache_aware_stats().misses_after;
  return all;
}

class CacheAwareUnionModel : public ::testing::Test {
 protected:
  void SetUp() override { write_synthetic_model(dir_.path(), small_config(), 99, 2); }
  TempDir dir_{"cacheaware_union"};
};

TEST_F(CacheAwareUnionModel, ToleranceZeroIsBitwiseThePlainBatch) {
  auto off = load_model(dir_.path(), {false, 0.0f}, true);
  auto zero = load_model(dir_.path(), union_at(0.0f), true);
  uint64_t subs = 1;
  const auto a = run_batch(*off, 12), b = run_batch(*zero, 12, nullptr, &subs);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0) << "logits " << i;
  EXPECT_EQ(subs, 0u);
  // The control: the same batch at a wide tolerance does substitute and change the logits.
  auto wide = load_model(dir_.path(), union_at(0.5f), true);
  uint64_t wide_subs = 0;
  const auto c = run_batch(*wide, 12, nullptr, &wide_subs);
  EXPECT_GT(wide_subs, 0u);
  EXPECT_NE(a, c);
}

TEST_F(CacheAwareUnionModel, TheUnionSubstitutesWhereNothingIsResidentAndReadsWhatItCounts) {
  // O_DIRECT, no host cache: the tiers hold nothing, so plain cache-aware routing changes nothing
  // and only the union can; every counted miss is one read, and the union reads fewer.
  auto plain = load_model(dir_.path(), {true, 0.5f}, false);
  auto uni = load_model(dir_.path(), union_at(0.5f), false);
  uint64_t reads_p = 0, subs_p = 1, misses_p = 0, reads_u = 0, subs_u = 0, misses_u = 0;
  run_batch(*plain, 8, &reads_p, &subs_p, &misses_p);
  run_batch(*uni, 8, &reads_u, &subs_u, &misses_u);
  EXPECT_EQ(subs_p, 0u);
  EXPECT_GT(subs_u, 0u);
  EXPECT_EQ(reads_p, misses_p);
  EXPECT_EQ(reads_u, misses_u);
  EXPECT_LT(reads_u, reads_p);
}

TEST_F(CacheAwareUnionModel, ASequenceAloneInABatchRoutesAsOneSequence) {
  // The same greedy request through forward() (single-stream cache-aware routing) and alone in
  // forward_batch with the union rule, each on a fresh model: the same residency step by step, so
  // bitwise the same logits and the same substitutions.
  auto solo = load_model(dir_.path(), {true, 0.5f}, true);
  auto batched = load_model(dir_.path(), union_at(0.5f), true);
  const std::vector<int> prompt = {5, 17, 40, 2, 2, 31, 8};
  const size_t V = size_t(solo->config().vocab_size);
  std::vector<float> la(V), lb(V);
  const int seq = batched->create_sequence();
  solo->forward(prompt, la);
  batched->forward_batch(std::vector<SequenceInput>{{seq, prompt, lb}});
  for (int step = 0; step < 16; ++step) {
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), V * sizeof(float)), 0) << "step " << step;
    const int tok = argmax(la);
    solo->forward(std::span<const int>(&tok, 1), la);
    batched->forward_batch(std::vector<SequenceInput>{{seq, std::span<const int>(&tok, 1), lb}});
  }
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), V * sizeof(float)), 0);
  EXPECT_GT(solo->cache_aware_stats().substitutions, 0u);  // the comparison means something
  EXPECT_EQ(solo->cache_aware_stats().substitutions, batched->cache_aware_stats().substitutions);
  EXPECT_EQ(solo->cache_aware_stats().misses_after, batched->cache_aware_stats().misses_after);
}

// infer --perplexity --parallel N (perplexity_batched): disjoint windows N at a time, one token
// per window per step. Without cache-aware routing every window's logits are those of its run
// alone token by token (max_batch 1), so the perplexity is perplexity(ctx, stride = ctx)'s up to
// the order of the sum; with the union rule at a wide tolerance the batch's windows substitute.
TEST_F(CacheAwareUnionModel, BatchedPerplexityEqualsTheWindowsOneByOneAndTheUnionChangesIt) {
  std::mt19937 rng(8);
  std::vector<int> text(100);
  for (int& t : text) t = int(rng() % 61);
  auto solo = load_model(dir_.path(), {false, 0.0f}, false, 1);
  auto batched = load_model(dir_.path(), {false, 0.0f}, false);
  const PerplexityResult a = perplexity(*solo, text, 16, 16);
  const PerplexityResult b = perplexity_batched(*batched, text, 16, 3);
  EXPECT_EQ(a.n_scored, b.n_scored);
  EXPECT_EQ(a.n_windows, b.n_windows);
  EXPECT_NEAR(a.mean_nll, b.mean_nll, 1e-9 * a.mean_nll);
  EXPECT_EQ(b.tokens_run, b.n_scored);  // every token run predicts one
  EXPECT_EQ(b.routing.routings, 0u);
  auto uni = load_model(dir_.path(), union_at(0.5f), false);
  const PerplexityResult c = perplexity_batched(*uni, text, 16, 3);
  EXPECT_GT(c.routing.substitutions, 0u);
  EXPECT_LT(c.routing.misses_after, c.routing.misses_before);
  EXPECT_NE(c.mean_nll, b.mean_nll);
  EXPECT_THROW(perplexity_batched(*batched, text, 16, 5), ConfigError);  // max_sequences is 4
}

}  // namespace
