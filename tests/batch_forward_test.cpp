// Tests of batched forward passes (Model::create_sequence / forward_batch, runtime/model/cpu_batch.h):
// each sequence's logits in a batch equal, bitwise, those of the same chunks run alone through
// Model::forward; sequences join and leave between steps and reuse freed slots; bad batches give
// clear errors; a step reads the union of its sequences' experts once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/store/store_options.h"
#include "runtime/convert/synthetic_model.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/model/forward_pass.h"
#include "tests/support/batch_harness.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

constexpr int kChunk = 8;  // prefill chunk: the solo model's max_batch, the batch driver's chunk

// Small models of each MoE shape the batch pass must keep per sequence: f32 dense weights (Eigen),
// bf16 with Qwen2-MoE's gated shared expert and QKV bias (ggml kernels), GLM-4.5's grouped sigmoid
// routing with an ungated shared expert and a dense first layer; DeepSeek-V3's MLA (latent KV slots).
ModelConfig shape(const std::string& kind) {
  ModelConfig c = test::tiny_moe_config({.vocab = 97, .hidden = 45, .layers = 3, .head_dim = 14,
                                         .intermediate = 37, .top_k = 3, .max_positions = 256});
  if (kind != "f32") c.dense_dtype = "bf16";
  if (kind == "bf16+shared") test::as_qwen2_moe(c, 50);
  if (kind == "bf16+glm") test::as_glm4_moe(c, {.shared = 40, .dense_intermediate = 60, .rotary_dim = 10});
  if (kind == "bf16+minimax") test::as_minimax_m2(c, 6);  // full-width QK-norm, partial rotary, sigmoid
  // DeepSeek-V3: MLA's latent cache per slot (head_dim 14 = nope 8 + rope 6)
  if (kind == "bf16+mla")
    test::as_deepseek_v3(c, {.q_lora = 20, .kv_lora = 18, .nope = 8, .rope = 6, .v = 10, .shared = 40,
                             .dense_intermediate = 60});
  return c;
}

std::unique_ptr<Model> load(const fs::path& dir, int max_batch, int max_context = 0, int threads = 2) {
  ModelOptions o;
  o.n_threads = threads;
  o.max_batch = max_batch;
  o.max_context = max_context;
  o.max_sequences = 4;
  StoreConfig sc;
  sc.io = "pread";  // every miss is a counted read (no host cache, nothing in place)
  return Model::load(dir, o, open_store_for(dir, ModelConfig::load(dir), sc));
}

using test::BatchRequest;
using test::four_requests;
using test::random_log;
using test::replaying;
using test::prefill_each;
using test::random_tokens;
using test::run_alone;
using test::StepUnion;

void run_batched(Model& m, std::vector<BatchRequest>& rs, const std::function<void(size_t, int)>& on_create = {}) {
  test::run_batched(m, rs, kChunk, on_create);
}

class BatchForward : public ::testing::TestWithParam<std::string> {};

// four_requests batched: every logit of every step is bitwise that of the request run alone.
TEST_P(BatchForward, EachSequenceMatchesItsRunAloneBitwise) {
  TempDir d("batch_fwd");
  const ModelConfig c = shape(GetParam());
  write_synthetic_model(d.path(), c, 41, 2);
  auto solo = load(d.path(), kChunk);
  auto batched = load(d.path(), 4 * kChunk);
  std::vector<BatchRequest> rs = four_requests(7, c.vocab_size);
  std::vector<BatchRequest> alone = rs;
  for (BatchRequest& r : alone) run_alone(*solo, r);
  run_batched(*batched, rs);
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].logits.size(), alone[i].logits.size()) << "request " << i;
    for (size_t s = 0; s < rs[i].logits.size(); ++s) {
      const auto& a = rs[i].logits[s];
      const auto& b = alone[i].logits[s];
      float worst = 0;
      for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "request " << i << " step " << s << ": max |diff| " << worst;
    }
  }
  // Three slots at most were live at once: request 3 reused request 0's.
  EXPECT_EQ(batched->n_past(), 0);  // forward()'s own sequence is untouched by batches
}

// Each sequence of a batch replays its own request of a routing log (Model::set_sequence_routing):
// every logit equals, bitwise, that of the request run alone through forward() replaying the
// same log request, the routing events of the batch carry the replayed experts at each sequence's
// positions, and the replay changes the output (the router would choose otherwise).
TEST_P(BatchForward, ReplayedSequencesMatchTheirRunsAloneBitwise) {
  TempDir d("batch_replay");
  const ModelConfig c = shape(GetParam());
  write_synthetic_model(d.path(), c, 51, 2);
  const RoutingReplay replay(random_log(c, 5, 40, 3), c, "random.log");
  ASSERT_EQ(replay.n_requests(), 5u);
  auto solo = load(d.path(), kChunk);
  auto batched = load(d.path(), 4 * kChunk);
  std::vector<BatchRequest> rs = four_requests(17, c.vocab_size);
  const test::ReplayedRuns runs = test::run_replayed(*solo, *batched, rs, replay, {4, 0, 2, 1}, kChunk);
  const std::vector<BatchRequest>& alone = runs.alone;
  EXPECT_NE(alone[0].logits, runs.first_on_router.logits) << "the replay changed nothing: the test could not fail";
  EXPECT_GT(runs.events, 0);
  EXPECT_EQ(runs.mismatched, 0);
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].logits.size(), alone[i].logits.size()) << "request " << i;
    for (size_t s = 0; s < rs[i].logits.size(); ++s)
      EXPECT_EQ(std::memcmp(rs[i].logits[s].data(), alone[i].logits[s].data(), rs[i].logits[s].size() * sizeof(float)), 0)
          << "request " << i << " step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchForward,
                         ::testing::Values("f32", "bf16+shared", "bf16+glm", "bf16+mla", "bf16+minimax"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '+', '_');
                           return s;
                         });

// The demo model (bf16 dense, q8 experts, 32 experts top-4): four greedy requests, batched with
// joins and leaves, give the logits of their runs alone, and the batch fetches fewer experts in
// all than the four runs alone (each step fetches the union of its sequences' experts).
TEST(BatchForwardDemo, GreedyRequestsMatchTheirRunsAloneAndReadLess) {
  const fs::path demo = fs::path(MOESTREAM_SOURCE_DIR) / "models/demo";
  auto solo = load(demo, kChunk, 256);
  auto batched = load(demo, 4 * kChunk, 256);
  const int V = solo->config().vocab_size;
  std::mt19937 rng(13);
  std::vector<BatchRequest> rs = {{random_tokens(rng, 12, V), 0, 8, {}, {}},
                                  {random_tokens(rng, 3, V), 0, 10, {}, {}},
                                  {random_tokens(rng, 20, V), 2, 6, {}, {}},
                                  {random_tokens(rng, 5, V), 9, 6, {}, {}}};
  std::vector<BatchRequest> alone = rs;
  const uint64_t solo0 = solo->expert_stats().experts_fetched();
  for (BatchRequest& r : alone) run_alone(*solo, r);
  const uint64_t solo_experts = solo->expert_stats().experts_fetched() - solo0;
  const uint64_t batch0 = batched->expert_stats().experts_fetched();
  run_batched(*batched, rs);
  const uint64_t batch_experts = batched->expert_stats().experts_fetched() - batch0;
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].logits.size(), alone[i].logits.size());
    for (size_t s = 0; s < rs[i].logits.size(); ++s)
      EXPECT_TRUE(rs[i].logits[s] == alone[i].logits[s]) << "request " << i << " step " << s;
  }
  std::printf("demo, 4 requests: the batch fetched %llu experts, the runs alone %llu\n",
              static_cast<unsigned long long>(batch_experts), static_cast<unsigned long long>(solo_experts));
  EXPECT_GT(batch_experts, 0u);
  EXPECT_LT(batch_experts, solo_experts);  // concurrent decode steps share experts
}

// The thread count never changes a batch's numbers (fixed row slices, as the single pass).
TEST(BatchForwardThreads, OneAndThreeThreadsGiveTheSameLogits) {
  TempDir d("batch_thr");
  const ModelConfig c = shape("f32");
  write_synthetic_model(d.path(), c, 43, 2);
  std::vector<std::vector<BatchRequest>> runs;
  for (int threads : {1, 3}) {
    auto m = load(d.path(), 4 * kChunk, 0, threads);
    std::mt19937 rng(9);
    std::vector<BatchRequest> rs = {{random_tokens(rng, 6, c.vocab_size), 0, 4, {}, {}},
                                    {random_tokens(rng, 3, c.vocab_size), 2, 4, {}, {}}};
    run_batched(*m, rs);
    runs.push_back(rs);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i].logits, runs[1][i].logits) << i;
}

// A decode step of three sequences fetches each selected expert once: the experts fetched are the
// union of their choices per layer (seen through the routing callback, tagged with each sequence),
// at most the sum of the three sequences' fetches when each steps alone.
TEST(BatchForwardIo, AStepReadsTheUnionOfItsSequencesExperts) {
  TempDir d("batch_io");
  ModelConfig c = shape("f32");
  c.n_experts = 6;  // three sequences x top-3 of 6 experts: overlaps are certain
  write_synthetic_model(d.path(), c, 45, 2);
  std::mt19937 rng(11);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(random_tokens(rng, 4 + i, c.vocab_size));
  const size_t V = size_t(c.vocab_size);
  const int next[3] = {5, 17, 60};

  auto m = load(d.path(), 4 * kChunk);
  const std::vector<int> seqs = prefill_each(*m, prompts);
  StepUnion routed;
  routed.record(*m);
  std::vector<std::vector<float>> out(3, std::vector<float>(V));
  std::vector<SequenceInput> step;
  for (int i = 0; i < 3; ++i) step.push_back({seqs[size_t(i)], std::span<const int>(&next[i], 1), out[size_t(i)], false});
  const ExpertStoreStats before = m->expert_stats();
  m->forward_batch(step);
  const ExpertStoreStats after = m->expert_stats();
  const size_t union_experts = routed.experts();
  EXPECT_EQ(routed.sequences, std::set<int>(seqs.begin(), seqs.end()));
  EXPECT_EQ(after.experts_fetched() - before.experts_fetched(), union_experts);
  const uint64_t batch_experts = after.experts_fetched() - before.experts_fetched();

  // The same three steps one sequence at a time (a second model in the same state).
  auto alone = load(d.path(), 4 * kChunk);
  std::vector<float> l(V);
  uint64_t solo_experts = 0;
  for (int i = 0; i < 3; ++i) {
    const int s = alone->create_sequence();
    const SequenceInput pre{s, prompts[size_t(i)], l, false};
    alone->forward_batch(std::span<const SequenceInput>(&pre, 1));
    const ExpertStoreStats b0 = alone->expert_stats();
    const SequenceInput in{s, std::span<const int>(&next[i], 1), l, false};
    alone->forward_batch(std::span<const SequenceInput>(&in, 1));
    solo_experts += alone->expert_stats().experts_fetched() - b0.experts_fetched();
    EXPECT_EQ(l, out[size_t(i)]) << "sequence " << i;
  }
  EXPECT_LE(batch_experts, solo_experts);
  EXPECT_GT(batch_experts, 0u);
  EXPECT_LT(union_experts, size_t(3 * c.n_experts_per_tok * c.n_moe_layers()));  // overlaps happened
}

// Bad batches name the problem, and nothing moves on error.
TEST(BatchForwardErrors, BadBatchesGiveClearErrors) {
  TempDir d("batch_err");
  const ModelConfig c = shape("f32");
  write_synthetic_model(d.path(), c, 47, 2);
  auto m = load(d.path(), 4 * kChunk, 12);
  const size_t V = size_t(c.vocab_size);
  std::vector<float> l(V);
  const std::vector<int> ten(10, 3), three(3, 4), one(1, 2);
  auto run = [&](std::vector<SequenceInput> b) {
    return test::error_message<ConfigError>([&] { m->forward_batch(b); });
  };
  EXPECT_NE(run({}).find("empty batch"), std::string::npos);
  EXPECT_NE(run({{0, one, l, false}}).find("sequence 0 is not a live sequence"), std::string::npos);
  const int a = m->create_sequence(), b = m->create_sequence();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_NE(run({{a, {}, l, false}}).find("has no tokens"), std::string::npos);
  EXPECT_NE(run({{a, one, l, false}, {a, one, l, false}}).find("appears twice"), std::string::npos);
  const std::vector<int> bad = {1, 97};
  EXPECT_NE(run({{a, bad, l, false}}).find("token id 97 outside the vocabulary"), std::string::npos);
  EXPECT_NE(run({{a, three, std::span<float>(l.data(), 5), false}}).find("logits buffer too small"),
            std::string::npos);
  m->forward_batch(std::vector<SequenceInput>{{a, ten, l, false}});
  // Position past the context: 10 + 3 > 12, in a batch with a valid entry that must not run.
  const std::string full = run({{b, one, l, false}, {a, three, l, false}});
  EXPECT_NE(full.find("sequence 0: context full: 10 + 3 tokens exceed the context of 12"), std::string::npos) << full;
  EXPECT_EQ(m->sequence_n_past(a), 10);
  EXPECT_EQ(m->sequence_n_past(b), 0);
  m->free_sequence(a);
  EXPECT_NE(run({{a, one, l, false}}).find("not a live sequence"), std::string::npos);
  EXPECT_NE(test::error_message<ConfigError>([&] { m->free_sequence(a); }).find("free_sequence: sequence 0"),
            std::string::npos);
  EXPECT_NE(test::error_message<ConfigError>([&] { m->sequence_n_past(9); }).find("not a live"), std::string::npos);
  // max_sequences = 4: the fifth live sequence is refused; a freed one comes back first, at 0.
  EXPECT_EQ(m->create_sequence(), 0);
  EXPECT_EQ(m->sequence_n_past(0), 0);
  m->create_sequence();
  m->create_sequence();
  EXPECT_NE(test::error_message<ConfigError>([&] { m->create_sequence(); }).find("all 4 sequence slots are in use"),
            std::string::npos);
  // Over max_batch (12 here: clamped to the context) in one step.
  const std::vector<int> seven(7, 1);
  EXPECT_NE(run({{0, seven, {}, false}, {1, seven, {}, false}}).find("exceed max_batch"), std::string::npos);
  // Routing overrides are per sequence.
  m->set_routing_override([](int, uint64_t, int, int*, float*) {});
  EXPECT_NE(run({{0, one, l, false}}).find("routing override"), std::string::npos);
  m->set_routing_override({});
  EXPECT_NE(test::error_message<ConfigError>([&] { m->truncate_sequence(0, 1); }).find("outside [0, n_past=0]"),
            std::string::npos);
  // A sequence's replay: only for a live one; it excludes cache-aware routing and the model-wide override.
  const RoutingOverrideFn keep = [](int, uint64_t, int, int*, float*) {};
  EXPECT_NE(test::error_message<ConfigError>([&] { m->set_sequence_routing(7, keep); }).find("not a live"),
            std::string::npos);
  m->set_sequence_routing(0, keep);
  CacheAwareOptions ca;
  ca.enabled = true;
  m->set_cache_aware(ca);
  EXPECT_NE(run({{0, one, l, false}}).find("sequence 0 replays its routing, which excludes cache-aware"),
            std::string::npos);
  m->set_cache_aware({});
  m->set_sequence_routing(-1, keep);
  EXPECT_NE(test::error_message<ConfigError>([&] { m->set_routing_override(keep); }).find("set_sequence_routing(-1)"),
            std::string::npos);
}

// A pass without batches (the GPU's, for now) refuses them by name.
TEST(BatchForwardErrors, PassesWithoutBatchesRefuseThem) {
  struct OneSequence final : ForwardPass {
    void forward_chunk(const ForwardChunk&, const RoutingControl&, ForwardTimes&, CacheAwareStats&) override {}
  } pass;
  ForwardTimes t;
  CacheAwareStats s;
  const std::string msg = test::error_message<ConfigError>([&] { pass.forward_batch({}, {}, t, s); });
  EXPECT_NE(msg.find("need the CPU pass (not --gpu)"), std::string::npos) << msg;
}

}  // namespace
