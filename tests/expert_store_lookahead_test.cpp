// Tests of the look-ahead (issue 19 item 5): ExpertStore::prefetch_predicted on the engine store
// (a guess then a demand fetch with overlapping and disjoint ids, a guess for another layer
// discarded, an expert awaited in flight rather than read twice, a corrupt guessed payload still
// caught), and the CPU pass with --moe-lookahead: the same greedy tokens as without it on the
// trained demo model, with predictions made and used.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/store/engine_expert_store.h"
#include "tests/support/store_payloads.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/model/sampler.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

// Blocks the completion of one read (by file offset) until opened, so a test can hold a guess in
// flight; says when that read has reached it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t offset = ~uint64_t{0};
  bool reached = false, open = false;
  int64_t hook(const CompletionInfo& c) {
    std::unique_lock<std::mutex> lock(mu);
    if (c.offset == offset) {
      reached = true;
      cv.notify_all();
      cv.wait(lock, [&] { return open; });
    }
    return c.result;
  }
  void wait_reached() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reached; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

bool direct(const ExpertStore& s) { return s.describe().find("O_DIRECT") != std::string::npos; }

// O_DIRECT files (so the page cache never holds a guess), with or without a host cache.
class Lookahead : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    c = test::tiny_moe_config({.vocab = 50, .hidden = 96, .head_dim = 8, .experts = 8, .quant = QuantType::kQ8});
    want = test::write_layer_files(d.path(), c, 23, /*permute=*/true);
  }
  std::unique_ptr<ExpertStore> open(Gate* gate = nullptr) {
    EngineExpertStoreOptions o;
    o.io.backend = IoBackend::kPread;
    o.io.direct = true;
    o.io.notice = [](const std::string&) {};
    if (GetParam()) o.host_cache_bytes = 8 * test::expert_slot_bytes(c);
    if (gate) o.io.completion_hook = [gate](const CompletionInfo& i) { return gate->hook(i); };
    auto s = open_engine_expert_store(d.path(), c, o);
    return s;
  }
  uint64_t slot_offset(int layer, int expert) const {
    const ExpertFileHeader h = read_expert_header(expert_file_path(d.path(), layer));
    return h.slot_offset(read_expert_map(expert_map_path(d.path(), layer)).physical(uint32_t(expert)));
  }
  // A store whose read of (layer, expert) is held at `gate`; null, with the gate opened, where
  // the filesystem refuses O_DIRECT (the caller skips).
  std::unique_ptr<ExpertStore> open_holding(Gate& gate, int layer, int expert) {
    gate.offset = slot_offset(layer, expert);
    auto s = open(&gate);
    if (direct(*s)) return s;
    gate.release();
    return nullptr;
  }
  void expect_fetch(ExpertStore& s, int layer, const std::vector<int>& ids) {
    std::vector<const uint8_t*> out;
    s.fetch(layer, ids, out);
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(std::memcmp(out[i], want[size_t(layer)][size_t(ids[i])].data(), want[size_t(layer)][size_t(ids[i])].size()), 0)
          << "layer " << layer << " expert " << ids[i];
  }
  TempDir d{"expert_store_lookahead_test"};
  ModelConfig c;
  test::Payloads want;
};

TEST_P(Lookahead, OverlappingIdsAreTakenNotReadAgain) {
  auto s = open();
  if (!direct(*s)) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  const std::vector<int> guess{1, 2, 3};
  s->prefetch_predicted(1, guess);
  ASSERT_EQ(s->stats().lookahead_read, 3u);  // stats() waits for the guess's reads to land
  expect_fetch(*s, 1, {2, 3, 4, 2});
  ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.lookahead_used, 2u);
  EXPECT_EQ(st.experts_read, 4u);  // three guessed, one demanded: 2 and 3 are not read again
  EXPECT_EQ(st.lookahead_demanded, 3u);
  EXPECT_EQ(st.lookahead_demanded_predicted, 2u);
  EXPECT_DOUBLE_EQ(st.lookahead_recall(), 2.0 / 3.0);
  expect_fetch(*s, 0, {0});  // the demand fetch of layer 1, and with it the guess, is released
  EXPECT_EQ(s->stats().lookahead_wasted, 1u);
}

TEST_P(Lookahead, DisjointIdsAreReadAndTheGuessIsWasted) {
  auto s = open();
  if (!direct(*s)) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  s->prefetch_predicted(1, std::vector<int>{1, 2});
  (void)s->stats();
  expect_fetch(*s, 1, {5, 6});
  expect_fetch(*s, 0, {7});
  ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.lookahead_used, 0u);
  EXPECT_EQ(st.lookahead_wasted, 2u);
  EXPECT_EQ(st.lookahead_demanded_predicted, 0u);
  EXPECT_EQ(st.experts_read, 5u);
  // With a host cache the guessed experts stay there, checked: a later fetch reads nothing.
  expect_fetch(*s, 1, {1, 2});
  EXPECT_EQ(s->stats().experts_read, GetParam() ? 5u : 7u);
}

TEST_P(Lookahead, AGuessForAnotherLayerIsDiscarded) {
  auto s = open();
  if (!direct(*s)) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  s->prefetch_predicted(1, std::vector<int>{3, 4});
  (void)s->stats();
  expect_fetch(*s, 0, {3, 4});  // layer 0's 3 and 4 are other experts
  EXPECT_EQ(s->stats().lookahead_wasted, 2u);
  expect_fetch(*s, 1, {4});
  const ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.lookahead_used, 0u);
  EXPECT_EQ(st.lookahead_demanded, 0u);  // no guess was pending for layer 1 any more
  EXPECT_EQ(st.experts_read, GetParam() ? 4u : 5u);  // with a host cache 4 stayed there
  // A later guess replaces an earlier one nobody took.
  s->prefetch_predicted(0, std::vector<int>{5});
  s->prefetch_predicted(1, std::vector<int>{6});
  expect_fetch(*s, 1, {6});
  EXPECT_EQ(s->stats().lookahead_predictions, 3u);
}

TEST_P(Lookahead, AnExpertInFlightIsAwaitedNotReadTwice) {
  Gate gate;
  auto s = open_holding(gate, 1, 5);
  if (!s) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  s->prefetch_predicted(1, std::vector<int>{5});
  gate.wait_reached();  // the guess's read of 5 is in flight and held
  s->begin_fetch(1, std::vector<int>{5, 0});
  // Expert 0 is read by the demand's own batch and lands while 5 is still held.
  size_t i = 9;
  const uint8_t* p = nullptr;
  ASSERT_TRUE(test::next_payload(*s, &i, &p, true));
  EXPECT_EQ(i, 1u);
  EXPECT_FALSE(test::next_payload(*s, &i, &p, false));
  gate.release();
  ASSERT_TRUE(test::next_payload(*s, &i, &p, true));
  EXPECT_EQ(i, 0u);
  EXPECT_EQ(std::memcmp(p, want[1][5].data(), want[1][5].size()), 0);
  EXPECT_FALSE(test::next_payload(*s, &i, &p, true));
  const ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.lookahead_awaited, 1u);
  EXPECT_EQ(st.experts_read, 2u);
}

TEST_P(Lookahead, AGuessNotStartedWhenItsLayerComesIsCancelled) {
  Gate gate;
  auto s = open_holding(gate, 1, 5);
  if (!s) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  s->prefetch_predicted(1, std::vector<int>{5});
  gate.wait_reached();  // the look-ahead's thread is held on this guess
  s->prefetch_predicted(1, std::vector<int>{6});  // replaces it; queued behind it
  s->begin_fetch(1, std::vector<int>{6});  // too late for the guess: read by the demand itself
  gate.release();
  size_t i = 0;
  const uint8_t* p = nullptr;
  ASSERT_TRUE(test::next_payload(*s, &i, &p, true));
  EXPECT_EQ(std::memcmp(p, want[1][6].data(), want[1][6].size()), 0);
  const ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.lookahead_cancelled, 1u);
  EXPECT_EQ(st.lookahead_used, 0u);
  EXPECT_EQ(st.lookahead_demanded_predicted, 1u);  // the guess was right, only late
  EXPECT_EQ(st.experts_read, 2u);                  // 5 by the first guess, 6 by the demand
}

TEST_P(Lookahead, AGuessNeverEvictsWhatTheCurrentFetchHandsOut) {
  EngineExpertStoreOptions o;
  o.io.backend = IoBackend::kPread;
  o.io.direct = true;
  o.io.notice = [](const std::string&) {};
  o.host_cache_bytes = 2 * test::expert_slot_bytes(c);  // room for the current fetch only
  auto s = open_engine_expert_store(d.path(), c, o);
  if (!direct(*s)) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
  std::vector<const uint8_t*> out;
  const std::vector<int> cur{0, 1};
  s->fetch(0, cur, out);  // both in the two cache slots, pinned while handed out
  s->prefetch_predicted(1, std::vector<int>{2, 3});
  ASSERT_EQ(s->stats().lookahead_read, 2u);  // read into the guess's scratch, not the slots
  for (size_t i = 0; i < cur.size(); ++i)
    EXPECT_EQ(std::memcmp(out[i], want[0][size_t(cur[i])].data(), want[0][size_t(cur[i])].size()), 0);
  expect_fetch(*s, 1, {3, 2});
  EXPECT_EQ(s->stats().lookahead_used, 2u);
}

TEST_P(Lookahead, ACorruptGuessIsStillCaught) {
  const fs::path f = expert_file_path(d.path(), 1);
  test::overwrite_bytes(f, slot_offset(1, 3) + 9, "\x77");
  {
    auto s = open();
    if (!direct(*s)) GTEST_SKIP() << "O_DIRECT refused on this filesystem";
    s->prefetch_predicted(1, std::vector<int>{3, 4});
    (void)s->stats();            // landed; the mismatch is found when the guess is checked
    expect_fetch(*s, 1, {4});    // the good guess is taken, the corrupt one never handed out
    const std::string msg = test::error_message([&] { expect_fetch(*s, 1, {3}); });
    EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  }
  // Taken while still in flight: the demand fetch throws where it would have read it.
  Gate gate;
  auto s = open_holding(gate, 1, 3);
  ASSERT_TRUE(s);  // O_DIRECT was accepted above
  s->prefetch_predicted(1, std::vector<int>{3});
  gate.wait_reached();
  s->begin_fetch(1, std::vector<int>{3});
  gate.release();
  size_t i = 0;
  const uint8_t* p = nullptr;
  const std::string msg = test::error_message([&] { test::next_payload(*s, &i, &p, true); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(HostCache, Lookahead, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "WithHostCache" : "Scratch"; });

const fs::path kDemo = fs::path(MOESTREAM_SOURCE_DIR) / "models/demo";

// Greedy tokens of the demo model on O_DIRECT with a host cache of a quarter of its experts.
std::vector<int> greedy(int lookahead, ExpertStoreStats* st) {
  const ModelConfig cfg = ModelConfig::load(kDemo);
  EngineExpertStoreOptions so;
  so.io.direct = true;
  so.io.notice = [](const std::string&) {};
  so.host_cache_bytes = test::expert_slot_bytes(cfg) * size_t(cfg.n_moe_layers() * cfg.n_experts) / 4;
  ModelOptions mo;
  mo.n_threads = 2;
  mo.moe_lookahead = lookahead;
  auto m = Model::load(kDemo, mo, open_expert_store("auto", kDemo, cfg, so));
  SamplerParams sp;
  sp.temperature = 0;
  Sampler s(sp);
  GenerateOptions go;
  go.n_new = 24;
  std::vector<int> out;
  const std::vector<int> prompt{5, 17, 42, 7};
  generate(*m, prompt, go, s, nullptr, &out);
  *st = m->expert_stats();
  return out;
}

TEST(LookaheadModel, GreedyTokensAreTheSameWithAndWithoutIt) {
  if (!fs::exists(kDemo / "model.json")) MOESTREAM_SKIP_OR_FAIL() << kDemo << " absent";
  ExpertStoreStats off, on;
  const std::vector<int> a = greedy(0, &off), b = greedy(4, &on);
  EXPECT_EQ(a, b);
  EXPECT_EQ(off.lookahead_predictions, 0u);
  EXPECT_GT(on.lookahead_predictions, 0u);
  EXPECT_GT(on.lookahead_demanded_predicted, 0u);
  EXPECT_GT(on.lookahead_recall(), 0.0);
  EXPECT_LE(on.lookahead_recall(), 1.0);
}

TEST(LookaheadModel, AWidthBeyondTheExpertsIsRefused) {
  if (!fs::exists(kDemo / "model.json")) MOESTREAM_SKIP_OR_FAIL() << kDemo << " absent";
  ModelOptions mo;
  mo.moe_lookahead = 33;  // the demo has 32 experts
  const std::string msg = test::error_message<ConfigError>([&] { Model::load(kDemo, mo); });
  EXPECT_NE(msg.find("--moe-lookahead 33 is outside [0, n_experts=32]"), std::string::npos) << msg;
}

}  // namespace
