// Tests of runtime/engine/routing_replay.h and Model::set_routing_override: a log replayed on its own
// shape reproduces the recorded experts exactly; the mapping rule onto other counts; infer's CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/routing_log.h"
#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/convert/synthetic_model.h"
#include "tests/support/test_model.h"

#include <nlohmann/json.hpp>
#include "tests/support/strict_skip.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

ModelConfig tiny(int layers, int experts, int top_k) {
  return test::tiny_moe_config({.layers = layers, .experts = experts, .top_k = top_k});
}

// Every routing decision of a forward run: [token][layer] -> ids.
struct Recorder {
  std::vector<std::vector<std::vector<int>>> ids;     // [position][layer][k]
  std::vector<std::vector<std::vector<float>>> w;
  void attach(Model& m) {
    m.set_routing_callback([this](const RoutingEvent& ev) {
      for (int t = 0; t < ev.n_tokens; ++t) {
        const size_t pos = size_t(ev.position + t);
        if (ids.size() <= pos) {
          ids.resize(pos + 1);
          w.resize(pos + 1);
        }
        ids[pos].resize(size_t(ev.layer) + 1);
        w[pos].resize(size_t(ev.layer) + 1);
        ids[pos][size_t(ev.layer)].assign(ev.ids + t * ev.top_k, ev.ids + (t + 1) * ev.top_k);
        w[pos][size_t(ev.layer)].assign(ev.weights + t * ev.top_k, ev.weights + (t + 1) * ev.top_k);
      }
    });
  }
};

// A prompt chunk then single-token steps, as decode runs.
void run_tokens(Model& m, const std::vector<int>& prompt, const std::vector<int>& decode) {
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.reset();
  m.forward(prompt, logits);
  for (int id : decode) m.forward(std::span<const int>(&id, 1), logits);
}

RoutingLog log_of(const Recorder& r, const ModelConfig& c) {
  RoutingLog log;
  log.header = {1, uint32_t(c.n_layers), uint32_t(c.n_experts), uint32_t(c.n_experts_per_tok),
                uint32_t(c.hidden_size)};
  // File order as infer writes it: layer-major within a chunk; one token per chunk suffices.
  for (size_t p = 0; p < r.ids.size(); ++p)
    for (size_t l = 0; l < r.ids[p].size(); ++l) {
      RoutingRecord rec;
      rec.request_id = 7;
      rec.position = uint32_t(p);
      rec.layer = uint16_t(l);
      for (int id : r.ids[p][l]) rec.ids.push_back(uint16_t(id));
      rec.weights = r.w[p][l];
      log.records.push_back(rec);
    }
  return log;
}

RoutingRecord record(uint64_t req, uint32_t pos, uint16_t layer, std::vector<uint16_t> ids,
                     std::vector<float> w) {
  RoutingRecord r;
  r.request_id = req;
  r.position = pos;
  r.layer = layer;
  r.ids = std::move(ids);
  r.weights = std::move(w);
  return r;
}

}  // namespace

TEST(RoutingReplay, ReplayOnTheSameShapeReproducesTheRecordedExpertsExactly) {
  TempDir d;
  const ModelConfig c = tiny(3, 16, 4);
  write_synthetic_model(d.path() / "a", c, 11, 2);
  write_synthetic_model(d.path() / "b", c, 12, 2);  // other weights: its router chooses otherwise
  const std::vector<int> prompt = {3, 14, 15, 9, 26}, decode = {5, 35, 8, 9, 7, 9};
  ModelOptions mo;
  mo.n_threads = 2;
  Recorder ra, rb_router, rb_replay;
  auto a = Model::load(d.path() / "a", mo);
  ra.attach(*a);
  run_tokens(*a, prompt, decode);
  auto b = Model::load(d.path() / "b", mo);
  rb_router.attach(*b);
  run_tokens(*b, prompt, decode);
  ASSERT_NE(rb_router.ids, ra.ids) << "the two models route alike: the test could not fail";

  const RoutingReplay replay(log_of(ra, c), c, "a.log");
  EXPECT_EQ(replay.n_steps(), prompt.size() + decode.size());
  auto b2 = Model::load(d.path() / "b", mo);
  b2->set_routing_override([&](int l, uint64_t o, int n, int* ids, float* w) { replay.route(l, o, n, ids, w); });
  EXPECT_TRUE(b2->routing_overridden());
  rb_replay.attach(*b2);
  run_tokens(*b2, prompt, decode);
  EXPECT_EQ(rb_replay.ids, ra.ids);
  EXPECT_EQ(rb_replay.w, ra.w);  // same counts: weights bit for bit

  // An empty override gives the router back.
  b2->set_routing_override({});
  EXPECT_FALSE(b2->routing_overridden());
  Recorder again;
  again.attach(*b2);
  run_tokens(*b2, prompt, decode);
  EXPECT_EQ(again.ids, rb_router.ids);
}

TEST(RoutingReplay, MapsLayersExpertsAndTopKOntoOtherCounts) {
  RoutingLog log;
  log.header = {1, 2, 8, 2, 16};  // 2 layers, 8 experts, top-2
  log.records = {record(1, 0, 0, {5, 1}, {0.7f, 0.3f}), record(1, 0, 1, {2, 6}, {0.6f, 0.4f}),
                 record(1, 1, 0, {7, 3}, {0.5f, 0.5f}), record(1, 1, 1, {0, 4}, {0.9f, 0.1f})};
  const ModelConfig c = tiny(3, 4, 3);  // 3 layers, 4 experts, top-3
  const RoutingReplay r(log, c, "x.log");
  ASSERT_EQ(r.n_steps(), 2u);
  int ids[6];
  float w[6];
  // Token 0, layer 0 <- log layer 0: 5->1, 1->1 taken -> 2, extra slot after 2 -> 3 with the
  // weakest weight; rescaled to the log's total (1.0).
  r.route(0, 0, 1, ids, w);
  EXPECT_EQ(std::vector<int>(ids, ids + 3), (std::vector<int>{1, 2, 3}));
  EXPECT_NEAR(w[0], 0.7f / 1.3f, 1e-6f);
  EXPECT_NEAR(w[1], 0.3f / 1.3f, 1e-6f);
  EXPECT_NEAR(w[2], 0.3f / 1.3f, 1e-6f);
  // Layer 1 <- log layer 1: 2, 6->2 taken -> 3, extra after 3 wraps to 0.
  r.route(1, 0, 1, ids, w);
  EXPECT_EQ(std::vector<int>(ids, ids + 3), (std::vector<int>{2, 3, 0}));
  // Layer 2 <- log layer 0 again; tokens 1 and 2 (= step 0 again: the log cycles) in one call.
  r.route(2, 1, 2, ids, w);
  EXPECT_EQ(std::vector<int>(ids, ids + 6), (std::vector<int>{3, 0, 1, 1, 2, 3}));  // 7->3, 3->3 taken->0
  // A model with fewer slots keeps the best ones: top-1 of token 1, layer 1 is log expert 0.
  const RoutingReplay r1(log, tiny(2, 8, 1), "x.log");
  r1.route(1, 1, 1, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_FLOAT_EQ(w[0], 1.0f);
}

TEST(RoutingReplay, IncompleteTokensAreDroppedAndAnEmptyLogIsRefused) {
  RoutingLog log;
  log.header = {1, 2, 8, 1, 16};
  log.records = {record(1, 0, 0, {5}, {1}), record(1, 0, 1, {2}, {1}), record(1, 1, 0, {4}, {1})};
  const RoutingReplay r(log, tiny(2, 8, 1), "x.log");
  EXPECT_EQ(r.n_steps(), 1u);
  EXPECT_EQ(r.dropped_steps(), 1u);
  EXPECT_NE(r.describe().find("replay"), std::string::npos);
  log.records.erase(log.records.begin(), log.records.begin() + 2);
  try {
    RoutingReplay bad(log, tiny(2, 8, 1), "x.log");
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("x.log"), std::string::npos) << e.what();
  }
}

// Per request: requests in order of first appearance, each one's steps by position whatever the
// file order (a server log interleaves concurrent requests), positions wrapping per request.
TEST(RoutingReplay, EachRequestReplaysItsOwnStepsByPosition) {
  RoutingLog log;
  log.header = {1, 1, 8, 1, 16};
  log.records = {record(9, 0, 0, {1}, {1}), record(4, 0, 0, {5}, {1}), record(9, 2, 0, {3}, {1}),
                 record(4, 1, 0, {6}, {1}), record(9, 1, 0, {2}, {1})};
  const RoutingReplay r(log, tiny(2, 8, 1), "x.log");
  ASSERT_EQ(r.n_requests(), 2u);
  EXPECT_EQ(r.request_steps(0), 3u);  // request id 9 came first
  EXPECT_EQ(r.request_steps(1), 2u);
  int ids[4];
  float w[4];
  r.route_request(0, 0, 0, 4, ids, w);  // positions 0..3 of request 9: 1, 2, 3, then 1 again
  EXPECT_EQ(std::vector<int>(ids, ids + 4), (std::vector<int>{1, 2, 3, 1}));
  r.route_request(1, 1, 1, 3, ids, w);  // model layer 1 <- log layer 0; positions 1..3 of request 4
  EXPECT_EQ(std::vector<int>(ids, ids + 3), (std::vector<int>{6, 5, 6}));
  EXPECT_NE(r.describe().find("in 2 requests"), std::string::npos) << r.describe();
  // The model-wide clock still walks the steps in file order.
  r.route(0, 0, 3, ids, w);
  EXPECT_EQ(std::vector<int>(ids, ids + 3), (std::vector<int>{1, 5, 3}));
}

// A directory: its logs in name order, requests concatenated; logs of other counts are refused.
TEST(RoutingReplay, ADirectoryOfLogsConcatenatesTheirRequests) {
  TempDir d;
  RoutingLogHeader h{1, 1, 8, 1, 16};
  {
    RoutingLogWriter b(d.path() / "b.log", h), a(d.path() / "a.log", h);
    a.append(record(0, 0, 0, {1}, {1}));
    a.append(record(1, 0, 0, {2}, {1}));
    b.append(record(0, 0, 0, {7}, {1}));
    a.close();
    b.close();
  }
  const RoutingReplay r = RoutingReplay::load(d.path(), tiny(1, 8, 1));
  ASSERT_EQ(r.n_requests(), 3u);
  int id;
  float w;
  const int want[3] = {1, 2, 7};
  for (size_t q = 0; q < 3; ++q) {
    r.route_request(q, 0, 0, 1, &id, &w);
    EXPECT_EQ(id, want[q]) << "request " << q;
  }
  EXPECT_NE(r.describe().find("(2 logs)"), std::string::npos) << r.describe();
  {
    RoutingLogWriter c(d.path() / "c.log", RoutingLogHeader{1, 1, 8, 2, 16});
    c.append(record(0, 0, 0, {1, 2}, {0.5f, 0.5f}));
    c.close();
  }
  const std::string msg = test::error_message<ConfigError>([&] { RoutingReplay::load(d.path(), tiny(1, 8, 1)); });
  EXPECT_NE(msg.find("c.log"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must share their counts"), std::string::npos) << msg;
  TempDir empty;
  EXPECT_NE(test::error_message<ConfigError>([&] { RoutingReplay::load(empty.path(), tiny(1, 8, 1)); })
                .find("no routing logs"),
            std::string::npos);
}

namespace {
test::CliResult run_infer(const std::string& args) { return test::run_tool("infer", args); }
std::vector<std::vector<uint16_t>> ids_of(const fs::path& log) {
  std::vector<std::vector<uint16_t>> v;
  for (const RoutingRecord& r : read_routing_log(log).records) v.push_back(r.ids);
  return v;
}
}  // namespace

TEST(InferReplayCli, ReplayedRunRecordsTheLogsExpertsAndSaysReplayEverywhere) {
  if (!test::have_tool("infer")) MOESTREAM_SKIP_OR_FAIL() << "infer not built";
  TempDir d;
  const ModelConfig c = tiny(3, 16, 4);
  write_synthetic_model(d.path() / "a", c, 21, 2);
  write_synthetic_model(d.path() / "b", c, 22, 2);
  const std::string common = " --prompt-ids 1,2,3,4 -n 6 --temp 0 --print-ids -t 2 ";
  const fs::path la = d.path() / "a.log", lb = d.path() / "b.log", lr = d.path() / "r.log";
  ASSERT_EQ(run_infer("-m " + (d.path() / "a").string() + common + "--collect-routing " + la.string()).status, 0);
  ASSERT_EQ(run_infer("-m " + (d.path() / "b").string() + common + "--collect-routing " + lb.string()).status, 0);
  ASSERT_NE(ids_of(la), ids_of(lb));
  const fs::path stats = d.path() / "s.json";
  const test::CliResult r = run_infer("-m " + (d.path() / "b").string() + common + "--replay-routing " +
                                la.string() + " --collect-routing " + lr.string() +
                                " --stats-json " + stats.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("# replay: replay of " + la.string(), 0), 0u) << r.output;
  EXPECT_EQ(ids_of(lr), ids_of(la));
  const nlohmann::json j = nlohmann::json::parse(read_file(stats));
  EXPECT_EQ(j.at("routing"), "replay");
  EXPECT_NE(j.at("routing_replay").get<std::string>().find(la.string()), std::string::npos);
  // Not replaying says so too; a replay refuses --cache-aware; a missing log fails.
  ASSERT_EQ(run_infer("-m " + (d.path() / "b").string() + common + "--stats-json " + stats.string()).status, 0);
  EXPECT_EQ(nlohmann::json::parse(read_file(stats)).at("routing"), "router");
  EXPECT_NE(run_infer("-m " + (d.path() / "b").string() + common + "--replay-routing " + la.string() +
                      " --cache-aware").status, 0);
  EXPECT_NE(run_infer("-m " + (d.path() / "b").string() + common + "--replay-routing " +
                      (d.path() / "none.log").string()).status, 0);
}
