// Tests of moestream-server's continuous batching (runtime/server/batch_scheduler.h) on models/demo:
// requests run together give what each gets alone through EngineSession (text, token ids, finish
// reason; greedy and seeded sampling, stop strings, a prompt longer than a prefill chunk); a
// cancelled request, and requests that fail (a bad token id, a full context), never change the
// others' output; slots and the queue refuse and free as JobQueue does.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/server/batch_scheduler.h"
#include "runtime/server/engine_session.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace std::chrono_literals;

namespace {

constexpr int kParallel = 3, kMaxBatch = 16;
constexpr int kChunk = kMaxBatch - (kParallel - 1);  // BatchScheduler::prefill_chunk()

fs::path demo_dir() { return fs::path(MOESTREAM_SOURCE_DIR) / "models" / "demo"; }

// The batch server's model, or (max_batch = kChunk) the reference whose forward() cuts a prompt
// into the same chunks as the scheduler.
std::unique_ptr<Model> load(int max_batch, int ctx = 256) {
  ModelOptions o;
  o.n_threads = 2;
  o.max_context = ctx;
  o.max_batch = max_batch;
  o.max_sequences = kParallel;
  return Model::load(demo_dir(), o);
}

struct Output {
  std::string text;
  std::vector<int> ids;
  std::string finish;  // finish_reason, or the error's message
  int completion_tokens = 0;
  int reused = 0;  // prompt_tokens_reused
  std::optional<uint64_t> replay;  // the log request it replayed
};

Output drain(Job& job) {
  Output o;
  while (true) {
    auto u = job.wait(1000ms);
    o.text += u.text;
    o.ids.insert(o.ids.end(), u.ids.begin(), u.ids.end());
    if (u.done) break;
  }
  if (auto r = job.result()) {
    o.finish = r->finish_reason;
    o.completion_tokens = r->completion_tokens;
    o.reused = r->prompt_tokens_reused;
    o.replay = r->replay_request;
  } else if (auto e = job.error()) {
    o.finish = "error: " + e->body().dump();
  }
  return o;
}

JobParams job(std::vector<int> prompt, int max_tokens, float temperature = 0, uint64_t seed = 0) {
  JobParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampler.temperature = temperature;
  p.sampler.seed = seed;
  return p;
}

std::vector<int> ids_of(const Tokenizer& tok, const std::string& s) {
  std::vector<int> out;
  for (int32_t id : tok.encode(s, false)) out.push_back(id);
  return out;
}

// Each job alone, one after another, through EngineSession (no prefix reuse); with `replays`,
// each replays its log request.
std::vector<Output> alone(const std::vector<JobParams>& jobs, const Tokenizer* tok,
                          RequestReplays* replays = nullptr) {
  auto model = load(kChunk);
  ServerMetrics metrics;
  EngineSession session(*model, tok, metrics, false);
  session.set_replays(replays);
  std::vector<Output> out;
  for (const JobParams& p : jobs) {
    Job j(p);
    session.run(j);
    out.push_back(drain(j));
  }
  return out;
}

// All jobs submitted at once to a BatchScheduler of kParallel slots (the rest wait and join).
std::vector<Output> together(Model& model, const std::vector<JobParams>& jobs, const Tokenizer* tok,
                             bool prefix_reuse = false, RequestReplays* replays = nullptr) {
  ServerMetrics metrics;
  BatchScheduler sched(model, tok, metrics, 8, kParallel, prefix_reuse);
  sched.set_replays(replays);
  EXPECT_EQ(sched.prefill_chunk(), kChunk);
  std::vector<std::shared_ptr<Job>> js;
  for (const JobParams& p : jobs) {
    js.push_back(std::make_shared<Job>(p));
    EXPECT_TRUE(sched.submit(js.back()));
  }
  std::vector<Output> out;
  for (auto& j : js) out.push_back(drain(*j));
  return out;
}

}  // namespace

TEST(BatchScheduler, RequestsTogetherGetWhatEachGetsAlone) {
  if (!fs::exists(demo_dir() / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model absent";
  const Tokenizer tok = Tokenizer::load(demo_dir() / "tokenizer.json");
  const std::string page = "The operating system keeps a table of pages. ";
  std::vector<JobParams> jobs = {
      job(ids_of(tok, page + "Each page"), 12),
      job(ids_of(tok, "Once upon a time"), 10, 0.9f, 1234),  // seeded sampling, per request
      job(ids_of(tok, page + page + page + "The kernel"), 9),  // longer than a prefill chunk
      job(ids_of(tok, "The disk"), 14),
      job(ids_of(tok, "In the morning the"), 0),  // prefill only
  };
  ASSERT_GT(jobs[2].prompt.size(), size_t(kChunk));
  const std::vector<Output> ref = alone(jobs, &tok);
  // A stop string from the reference text of job 3: the batch must cut at the same place.
  const std::string text3 = ref[3].text;
  ASSERT_GT(text3.size(), 8u);
  jobs.push_back(jobs[3]);
  jobs.back().stop = {text3.substr(text3.size() / 2, 3)};
  const std::vector<Output> ref_all = alone(jobs, &tok);
  EXPECT_EQ(ref_all.back().finish, "stop");

  auto model = load(kMaxBatch);
  const std::vector<Output> got = together(*model, jobs, &tok);
  ASSERT_EQ(got.size(), ref_all.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].text, ref_all[i].text) << "job " << i;
    EXPECT_EQ(got[i].finish, ref_all[i].finish) << "job " << i;
    EXPECT_EQ(got[i].completion_tokens, ref_all[i].completion_tokens) << "job " << i;
  }
  // Without a tokenizer, the same replies as token ids; and again with prefix reuse across slots.
  const std::vector<Output> ids = together(*model, {jobs[0], jobs[3]}, nullptr, true);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids[0].ids.begin(), ids[0].ids.end()), true), ref_all[0].text);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids[1].ids.begin(), ids[1].ids.end()), true), ref_all[3].text);
}

// Prefix reuse per slot: a prompt extending an earlier request's takes that request's slot and runs
// only the rest; the reply is the one EngineSession gives with its own prefix reuse.
TEST(BatchScheduler, AFollowUpReusesItsSlotsPrefix) {
  if (!fs::exists(demo_dir() / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model absent";
  const Tokenizer tok = Tokenizer::load(demo_dir() / "tokenizer.json");
  const std::vector<int> first = ids_of(tok, "The operating system keeps a table of pages.");
  std::vector<int> follow = first;
  for (int id : ids_of(tok, " Each page maps to a frame")) follow.push_back(id);
  const std::vector<JobParams> jobs = {job(ids_of(tok, "Once upon a time"), 6), job(first, 6), job(follow, 6)};
  auto ref_model = load(kChunk);
  ServerMetrics m0;
  EngineSession session(*ref_model, nullptr, m0, true);
  std::vector<Output> ref;
  for (const JobParams& p : {jobs[1], jobs[2]}) {
    Job j(p);
    session.run(j);
    ref.push_back(drain(j));
  }
  auto model = load(kMaxBatch);
  ServerMetrics metrics;
  BatchScheduler sched(*model, nullptr, metrics, 4, kParallel, true);
  std::vector<Output> got;
  for (const JobParams& p : jobs) {  // one after another: the slots' caches are known
    auto j = std::make_shared<Job>(p);
    ASSERT_TRUE(sched.submit(j));
    got.push_back(drain(*j));
  }
  EXPECT_EQ(got[1].ids, ref[0].ids);
  EXPECT_EQ(got[2].ids, ref[1].ids);
  EXPECT_EQ(got[2].reused, ref[1].reused);
  EXPECT_GE(got[2].reused, int(first.size()));  // the first prompt and some of its reply
}

TEST(BatchScheduler, ACancelledOrFailingRequestNeverChangesAnothersOutput) {
  if (!fs::exists(demo_dir() / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model absent";
  const Tokenizer tok = Tokenizer::load(demo_dir() / "tokenizer.json");
  const JobParams a = job(ids_of(tok, "The operating system keeps a table of pages."), 24);
  const Output ref = alone({a}, nullptr)[0];
  ASSERT_EQ(ref.ids.size(), 24u);

  auto model = load(kMaxBatch, 64);
  ServerMetrics metrics;
  BatchScheduler sched(*model, nullptr, metrics, 8, kParallel, false);
  auto ja = std::make_shared<Job>(a);
  auto jb = std::make_shared<Job>(job(ids_of(tok, "Once upon a time"), 200));  // cancelled below
  JobParams bad = job({1, 2, 1 << 20}, 4);                                   // a token id outside the vocabulary
  JobParams full = job(std::vector<int>(40, 7), 60);                         // runs past the context of 64
  auto jc = std::make_shared<Job>(bad), jd = std::make_shared<Job>(full);
  for (auto& j : {ja, jb, jc, jd}) ASSERT_TRUE(sched.submit(j));
  // B streams a few tokens, then its client leaves.
  size_t b_ids = 0;
  while (b_ids < 3) b_ids += jb->wait(1000ms).ids.size();
  sched.cancel(jb);
  const Output oa = drain(*ja), ob = drain(*jb), oc = drain(*jc), od = drain(*jd);
  EXPECT_EQ(oa.ids, ref.ids);
  EXPECT_EQ(oa.finish, "length");
  EXPECT_EQ(ob.finish, "cancelled");
  EXPECT_LT(ob.completion_tokens, 200);
  EXPECT_NE(oc.finish.find("engine_error"), std::string::npos) << oc.finish;
  EXPECT_NE(od.finish.find("engine_error"), std::string::npos) << od.finish;
  EXPECT_GT(od.ids.size(), 0u);  // it ran until the context was full
  // Every slot is free again: three more requests run at once and A's reply is unchanged.
  EXPECT_FALSE(sched.running());
  std::vector<std::shared_ptr<Job>> again;
  for (int i = 0; i < 3; ++i) {
    again.push_back(std::make_shared<Job>(a));
    ASSERT_TRUE(sched.submit(again.back()));
  }
  for (auto& j : again) EXPECT_EQ(drain(*j).ids, ref.ids);
}

// A routing log over the demo's counts with random ids (distinct per token): traffic its router
// would not choose.
std::shared_ptr<const RoutingReplay> random_replay(const ModelConfig& c, int requests, int positions) {
  std::mt19937 rng(21);
  RoutingLog log;
  log.header = {1, uint32_t(c.n_moe_layers()), uint32_t(c.n_experts), uint32_t(c.n_experts_per_tok),
                uint32_t(c.hidden_size)};
  std::vector<uint16_t> all(size_t(c.n_experts));
  for (int r = 0; r < requests; ++r)
    for (int p = 0; p < positions; ++p)
      for (int l = 0; l < c.n_moe_layers(); ++l) {
        RoutingRecord rec;
        rec.request_id = uint64_t(r);
        rec.position = uint32_t(p);
        rec.layer = uint16_t(l);
        for (size_t e = 0; e < all.size(); ++e) all[e] = uint16_t(e);
        std::shuffle(all.begin(), all.end(), rng);
        rec.ids.assign(all.begin(), all.begin() + c.n_experts_per_tok);
        rec.weights.assign(size_t(c.n_experts_per_tok), 1.0f / float(c.n_experts_per_tok));
        log.records.push_back(rec);
      }
  return std::make_shared<const RoutingReplay>(log, c, "random.log");
}

// --replay-routing: requests replaying their own log requests, run together (one cancelled
// midway), give what each gets alone through EngineSession replaying the same request; without
// replay_request the requests take the log's requests in turn.
TEST(BatchScheduler, ReplayedRequestsTogetherGetWhatEachGetsAlone) {
  if (!fs::exists(demo_dir() / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model absent";
  const Tokenizer tok = Tokenizer::load(demo_dir() / "tokenizer.json");
  const auto replay = random_replay(ModelConfig::load(demo_dir()), 4, 48);
  const std::string page = "The operating system keeps a table of pages. ";
  std::vector<JobParams> jobs = {job(ids_of(tok, page + "Each page"), 12), job(ids_of(tok, "Once upon a time"), 10),
                                 job(ids_of(tok, page + page + page + "The kernel"), 9),
                                 job(ids_of(tok, "The disk"), 14)};
  ASSERT_GT(jobs[2].prompt.size(), size_t(kChunk));
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].replay_request = (i + 3) % 4;
  RequestReplays ref_replays(replay);
  const std::vector<Output> ref = alone(jobs, nullptr, &ref_replays);
  const std::vector<Output> router = alone({jobs[0]}, nullptr);
  EXPECT_NE(ref[0].ids, router[0].ids) << "the replay changed nothing: the test could not fail";

  // Together, with a fifth request that streams a few tokens and is cancelled.
  auto model = load(kMaxBatch);
  ServerMetrics metrics;
  RequestReplays replays(replay);
  BatchScheduler sched(*model, nullptr, metrics, 8, kParallel, false);
  sched.set_replays(&replays);
  JobParams cancelled = job(ids_of(tok, "In the morning the"), 200);
  cancelled.replay_request = 1;
  auto jc = std::make_shared<Job>(cancelled);
  std::vector<std::shared_ptr<Job>> js = {std::make_shared<Job>(jobs[0]), jc};
  for (size_t i = 1; i < jobs.size(); ++i) js.push_back(std::make_shared<Job>(jobs[i]));
  for (auto& j : js) ASSERT_TRUE(sched.submit(j));
  size_t c_ids = 0;
  while (c_ids < 3) c_ids += jc->wait(1000ms).ids.size();
  sched.cancel(jc);
  std::vector<Output> got;
  for (auto& j : js) got.push_back(drain(*j));
  EXPECT_EQ(got[1].finish, "cancelled");
  got.erase(got.begin() + 1);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(got[i].ids, ref[i].ids) << "job " << i;
    EXPECT_EQ(got[i].replay, jobs[i].replay_request) << "job " << i;
  }
  // In turn: one after another, requests without replay_request take log requests 0, 1, 2.
  for (uint64_t want = 0; want < 3; ++want) {
    auto j = std::make_shared<Job>(job({1, 2, 3}, 2));
    ASSERT_TRUE(sched.submit(j));
    EXPECT_EQ(drain(*j).replay, want);
  }
}

TEST(BatchScheduler, QueueRefusesWhenFullAndParallelIsChecked) {
  if (!fs::exists(demo_dir() / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model absent";
  auto model = load(kMaxBatch);
  ServerMetrics metrics;
  EXPECT_NE(test::error_message<ConfigError>([&] { BatchScheduler s(*model, nullptr, metrics, 1, kParallel + 1, false); })
                .find("`parallel` 4 must be in [1, 3]"),
            std::string::npos);
  // One waiting place beside the slots: long jobs fill the slots and the queue, the next is refused.
  BatchScheduler sched(*model, nullptr, metrics, 1, 2, false);
  std::vector<std::shared_ptr<Job>> js;
  int accepted = 0;
  for (int i = 0; i < 5; ++i) {
    auto j = std::make_shared<Job>(job({1, 2, 3}, 150));
    if (sched.submit(j)) {
      ++accepted;
      js.push_back(j);
    }
  }
  EXPECT_EQ(accepted, 3);  // two slots and one waiting place, whether or not the worker took them yet
  for (auto& j : js) sched.cancel(j);
  for (auto& j : js) drain(*j);
  sched.shutdown();
  EXPECT_FALSE(sched.submit(std::make_shared<Job>(job({1}, 1))));
}
