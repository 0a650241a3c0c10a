// Tests of the routing step both passes share (runtime/model/routing_step.h): each sequence's
// replay lands on its own rows only, ids are checked whoever wrote them, cache-aware routing at
// tolerance 0 changes nothing, events come one per sequence, and gpt-oss's router refuses
// cache-aware routing before any layer runs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/model/routing_step.h"
#include "tests/support/test_model.h"

using namespace moestream;

namespace {

constexpr int kE = 6, kK = 2, kD = 3;

ModelConfig config() {
  ModelConfig c;
  c.n_experts = kE;
  c.n_experts_per_tok = kK;
  c.hidden_size = kD;
  return c;
}

// Rows 0..T-1 all choose {0, 1} with weights 0.6/0.4, as a router would hand them over.
struct Choices {
  std::vector<int> ids;
  std::vector<float> w;
  explicit Choices(int T) {
    for (int t = 0; t < T; ++t) {
      ids.insert(ids.end(), {0, 1});
      w.insert(w.end(), {0.6f, 0.4f});
    }
  }
};

const ResidencyFn kNoResidency = [](int, std::span<uint8_t>) { FAIL() << "residency asked without substitution"; };

TEST(RoutingStep, EachSequenceReplaysOnItsOwnRowsOnly) {
  const ModelConfig cfg = config();
  RoutingStep step(cfg);
  int calls = 0;
  const RoutingOverrideFn replay = [&](int layer, uint64_t ordinal, int n, int* ids, float* w) {
    ++calls;
    EXPECT_EQ(layer, 4);
    EXPECT_EQ(ordinal, 17u);
    EXPECT_EQ(n, 2);
    for (int i = 0; i < n * kK; ++i) ids[i] = 5 - i, w[i] = 0.25f;
  };
  // Sequence 0: row 0, the router's; sequence 1: rows 1-2, replayed; sequence 2: row 3, the router's.
  const std::vector<RoutingSequence> seqs = {{0, 1, 9, false, 3, nullptr, 0},
                                             {1, 2, 17, true, 5, &replay, 17},
                                             {3, 1, 2, false, 0, nullptr, 2}};
  RoutingControl control;
  CacheAwareStats stats;
  step.begin_chunk(control, seqs, stats);
  EXPECT_FALSE(step.router_only());
  EXPECT_EQ(step.chunk_override(), nullptr);  // look-ahead's exact predictor: one sequence only
  Choices c(4);
  EXPECT_TRUE(step.decide(4, c.ids.data(), c.w.data(), nullptr, nullptr, kNoResidency));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(c.ids, (std::vector<int>{0, 1, 5, 4, 3, 2, 0, 1}));
  EXPECT_EQ(c.w, (std::vector<float>{0.6f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f, 0.6f, 0.4f}));
}

TEST(RoutingStep, AnIdOutsideTheExpertsIsAnErrorNamingLayerAndSource) {
  const ModelConfig cfg = config();
  RoutingStep step(cfg);
  RoutingControl control;
  control.override = [](int, uint64_t, int, int* ids, float*) { ids[1] = kE; };
  CacheAwareStats stats;
  ForwardChunk chunk;
  chunk.n_tokens = 1;
  step.begin_chunk(control, chunk, stats);
  ASSERT_NE(step.chunk_override(), nullptr);
  Choices c(1);
  const std::string msg = test::error_message<FormatError>(
      [&] { step.decide(7, c.ids.data(), c.w.data(), nullptr, nullptr, kNoResidency); });
  EXPECT_NE(msg.find("MoE layer 7 (decoder layer 7): expert id 6 outside [0, 6) from the routing override"), std::string::npos) << msg;
  // The router's own ids are checked as well (the GPU's came back over the bus).
  RoutingControl plain;
  step.begin_chunk(plain, chunk, stats);
  EXPECT_TRUE(step.router_only());
  Choices bad(1);
  bad.ids[0] = -1;
  EXPECT_NE(test::error_message<FormatError>([&] {
              step.decide(0, bad.ids.data(), bad.w.data(), nullptr, nullptr, kNoResidency);
            }).find("from the router"),
            std::string::npos);
  // In a batch, the row's own sequence names the source; a dense first layer shifts the decoder
  // layer the message names.
  ModelConfig dense_first = config();
  dense_first.first_k_dense_replace = 1;
  RoutingStep batch_step(dense_first);
  const RoutingOverrideFn keep = [](int, uint64_t, int, int*, float*) {};
  const std::vector<RoutingSequence> seqs = {{0, 1, 0, false, 0, &keep, 0}, {1, 1, 0, false, 1, nullptr, 0}};
  batch_step.begin_chunk(plain, seqs, stats);
  Choices two(2);
  two.ids[2] = 99;  // row 1: the router's sequence
  const std::string m = test::error_message<FormatError>(
      [&] { batch_step.decide(3, two.ids.data(), two.w.data(), nullptr, nullptr, kNoResidency); });
  EXPECT_NE(m.find("MoE layer 3 (decoder layer 4): expert id 99 outside [0, 6) from the router"), std::string::npos)
      << m;
}

TEST(RoutingStep, CacheAwareAtToleranceZeroChangesNothingAndCounts) {
  const ModelConfig cfg = config();
  RoutingStep step(cfg);
  RoutingControl control;
  control.cache_aware.enabled = true;
  control.cache_aware.tolerance = 0;
  CacheAwareStats stats;
  ForwardChunk chunk;
  chunk.n_tokens = 2;
  step.begin_chunk(control, chunk, stats);
  ASSERT_TRUE(step.substitutes());
  const std::vector<float> logits = {5, 4, 3.99f, 0, 0, 0, 5, 4, 3.99f, 0, 0, 0};
  int asked = 0;
  const ResidencyFn only_2 = [&](int layer, std::span<uint8_t> r) {
    ++asked;
    EXPECT_EQ(layer, 1);
    for (size_t e = 0; e < r.size(); ++e) r[e] = e == 2;
  };
  Choices c(2);
  EXPECT_FALSE(step.decide(1, c.ids.data(), c.w.data(), logits.data(), nullptr, only_2));
  EXPECT_EQ(asked, 1);  // one snapshot for the chunk
  EXPECT_EQ(c.ids, Choices(2).ids);
  EXPECT_EQ(stats.routings, 2u);
  EXPECT_EQ(stats.misses_before, 2u);  // experts 0 and 1, read once for both rows
  // A tolerance that reaches expert 2 swaps the weaker slot and says the weights changed.
  control.cache_aware.tolerance = 0.5f;
  step.begin_chunk(control, chunk, stats);
  EXPECT_TRUE(step.decide(1, c.ids.data(), c.w.data(), logits.data(), nullptr, only_2));
  EXPECT_EQ(c.ids, (std::vector<int>{0, 2, 0, 2}));
}

TEST(RoutingStep, EventsComeOnePerSequenceWithItsRows) {
  const ModelConfig cfg = config();
  RoutingStep step(cfg);
  std::vector<RoutingEvent> seen;
  RoutingControl control;
  control.on_routing = [&](const RoutingEvent& ev) { seen.push_back(ev); };
  const std::vector<RoutingSequence> seqs = {{0, 2, 40, true, 1, nullptr, 0}, {2, 1, 7, false, 0, nullptr, 0}};
  CacheAwareStats stats;
  step.begin_chunk(control, seqs, stats);
  ASSERT_TRUE(step.observed());
  Choices c(3);
  const std::vector<float> inputs(3 * kD, 1.0f);
  step.publish(2, c.ids.data(), c.w.data(), inputs.data());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].layer, 2);
  EXPECT_EQ(seen[0].sequence, 1);
  EXPECT_EQ(seen[0].position, 40);
  EXPECT_EQ(seen[0].n_tokens, 2);
  EXPECT_TRUE(seen[0].prefill);
  EXPECT_EQ(seen[0].ids, c.ids.data());
  EXPECT_EQ(seen[1].sequence, 0);
  EXPECT_EQ(seen[1].position, 7);
  EXPECT_EQ(seen[1].ids, c.ids.data() + 2 * kK);
  EXPECT_EQ(seen[1].weights, c.w.data() + 2 * kK);
  EXPECT_EQ(seen[1].router_inputs, inputs.data() + 2 * kD);
  EXPECT_EQ(seen[1].top_k, kK);
  EXPECT_EQ(seen[1].hidden, kD);
}

TEST(RoutingStep, GptOssRouterRefusesCacheAwareRoutingBeforeAnyLayer) {
  ModelConfig cfg = config();
  cfg.router_softmax_topk = true;
  RoutingStep step(cfg);
  RoutingControl control;
  control.cache_aware.enabled = true;
  CacheAwareStats stats;
  ForwardChunk chunk;
  chunk.n_tokens = 1;
  EXPECT_NE(test::error_message<ConfigError>([&] { step.begin_chunk(control, chunk, stats); }).find("gpt-oss"),
            std::string::npos);
  // A replay decides instead of the router: nothing to substitute, nothing refused.
  control.override = [](int, uint64_t, int, int*, float*) {};
  EXPECT_NO_THROW(step.begin_chunk(control, chunk, stats));
  EXPECT_FALSE(step.substitutes());
}

}  // namespace
