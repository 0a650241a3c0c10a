// Server logic without HTTP: stop strings, the bounded job queue, request validation, metrics, KV
// prefix reuse in EngineSession giving the same tokens as a fresh prefill, client disconnect probing.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "runtime/server/client_connection.h"
#include "runtime/server/completion_request.h"
#include "runtime/server/connection_queue.h"
#include "runtime/server/engine_session.h"
#include "runtime/server/job_queue.h"
#include "runtime/server/server_metrics.h"
#include "runtime/server/stop_matcher.h"
#include "tests/support/strict_skip.h"

using namespace moestream;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(StopMatcher, HoldsBackAPossibleStopPrefixAndCutsAtTheStop) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.feed("abc E"), "abc ");  // "E" may start "END"
  EXPECT_EQ(m.feed("N"), "");
  EXPECT_EQ(m.feed("Dxyz"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenItTurnsOutNotToBeAStop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.feed("a\n"), "a");
  EXPECT_EQ(m.feed("EN"), "\n");
  EXPECT_EQ(m.feed("x"), "ENx");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.feed("E"), "");
  EXPECT_EQ(m.flush(), "E");
}

namespace {
std::shared_ptr<Job> make_job() { return std::make_shared<Job>(JobParams{}); }
}  // namespace

TEST(JobQueue, RefusesWhenFullAndACancelledWaiterFreesItsPlace) {
  std::atomic<bool> release{false};
  std::atomic<int> dropped{0};
  JobQueue q(1, [&](Job& j) {
    while (!release) std::this_thread::sleep_for(1ms);
    j.finish(JobResult{"stop"});
  }, [&](const Job&) { ++dropped; });
  auto running = make_job(), waiting = make_job(), third = make_job();
  ASSERT_TRUE(q.submit(running));
  for (int i = 0; i < 1000 && !q.running(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(q.running());
  ASSERT_TRUE(q.submit(waiting));
  EXPECT_FALSE(q.submit(third));  // one place, taken
  waiting->cancel();              // its client left (seen by the job only)
  EXPECT_EQ(q.waiting(), 0u);
  EXPECT_TRUE(q.submit(third));
  EXPECT_EQ(waiting->result()->finish_reason, "cancelled");
  EXPECT_EQ(dropped.load(), 1);   // reported once, for the metrics
  q.cancel(third);                // through the queue: leaves it at once
  EXPECT_EQ(third->result()->finish_reason, "cancelled");
  EXPECT_EQ(dropped.load(), 2);
  auto fourth = make_job();
  EXPECT_TRUE(q.submit(fourth));
  release = true;
  EXPECT_TRUE(fourth->wait(5000ms).done || fourth->wait(5000ms).done);
  EXPECT_EQ(fourth->result()->finish_reason, "stop");
  q.cancel(running);              // already finished: nothing is dropped
  EXPECT_EQ(dropped.load(), 2);
}

TEST(JobQueue, ShutdownFailsWaitingJobsWith503AndFinishesTheRunningOne) {
  std::atomic<bool> started{false};
  JobQueue q(4, [&](Job& j) {
    started = true;
    std::this_thread::sleep_for(50ms);
    j.finish(JobResult{"length"});
  });
  auto a = make_job(), b = make_job();
  ASSERT_TRUE(q.submit(a));
  while (!started) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(q.submit(b));
  q.shutdown();
  EXPECT_EQ(a->result()->finish_reason, "length");
  ASSERT_TRUE(b->error().has_value());
  EXPECT_EQ(b->error()->status(), 503);
  EXPECT_FALSE(q.submit(make_job()));
}

TEST(CompletionRequest, NamesTheBadFieldAndRejectsAnotherModelWith404) {
  const RequestLimits lim{"demo", 512};
  auto status_of = [&](const std::string& body, bool chat, std::string* param = nullptr) {
    try {
      parse_completion_request(body, chat, lim);
    } catch (const ApiError& e) {
      if (param) *param = e.param();
      return e.status();
    }
    return 200;
  };
  std::string p;
  EXPECT_EQ(status_of(R"({"prompt": "x", "max_tokens": 513})", false, &p), 400);
  EXPECT_EQ(p, "max_tokens");
  EXPECT_EQ(status_of(R"({"prompt": "x", "temperature": -1})", false, &p), 400);
  EXPECT_EQ(p, "temperature");
  EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})", true, &p), 400);
  EXPECT_EQ(p, "messages[0].content[0]");
  EXPECT_EQ(status_of(R"({"prompt": "x", "model": "other"})", false), 404);
  EXPECT_EQ(status_of("\xff", false), 400);
  EXPECT_EQ(status_of(R"({"prompt": "x", "max_tokens": 512, "stop": ["a", "b"]})", false), 200);
  const auto r = parse_completion_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})",
      true, lim);
  EXPECT_EQ(r.messages[0]["content"], "ab");
}

namespace {
// The ApiError parse_completion_request throws for `body` (status 0 when it accepts it).
ApiError error_of(const std::string& body, bool chat) {
  try {
    parse_completion_request(body, chat, RequestLimits{"demo", 512});
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "accepted");
}

// `depth` nested arrays around `inner`, balanced (valid JSON): ~200 KB at 100000 levels.
std::string nested(int depth, const std::string& inner = "") {
  return std::string(size_t(depth), '[') + inner + std::string(size_t(depth), ']');
}
}  // namespace

TEST(CompletionRequest, DeepNestingInAnyFieldGets400BeforeAnyRecursiveCode) {
  // Each of these crashed the server with a stack overflow (copying or rendering the value).
  const std::string deep = nested(100000);
  const std::vector<std::pair<std::string, bool>> bodies = {
      {R"({"prompt": )" + deep + "}", false},
      {R"({"prompt": "x", "ignored_field": )" + deep + "}", false},
      {R"({"messages": [{"role": "user", "content": )" + deep + "}]}", true},
      {R"({"messages": [{"role": "user", "content": "x", "name": )" + deep + "}]}", true},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [)" + deep + "]}", true},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"k": )" + deep + "}}", true},
      {std::string(200000, '{'), false},  // not even valid JSON: still refused by depth first
  };
  for (const auto& [body, chat] : bodies) {
    const ApiError e = error_of(body, chat);
    EXPECT_EQ(e.status(), 400) << body.substr(0, 80);
    EXPECT_EQ(e.code(), "json_too_deep");
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxRequestJsonDepth)), std::string::npos) << e.what();
  }
}

TEST(CompletionRequest, DepthLimitCountsOnlyBracketsOutsideStrings) {
  // The body object is level 1: a field may nest kMaxRequestJsonDepth - 1 more levels.
  const int inner = kMaxRequestJsonDepth - 1;
  // Within the limit the depth check passes and the unknown field is what is refused.
  EXPECT_EQ(error_of(R"({"prompt": "x", "extra": )" + nested(inner) + "}", false).param(), "extra");
  EXPECT_EQ(error_of(R"({"prompt": "x", "extra": )" + nested(inner + 1) + "}", false).code(), "json_too_deep");
  // Brackets inside strings, after escaped quotes and backslashes, are text.
  const std::string text = std::string(1000, '[') + R"(\\\" [[[ {{{ \\)";
  EXPECT_EQ(error_of(R"({"prompt": ")" + text + R"("})", false).status(), 0);
  EXPECT_EQ(error_of(R"({"prompt": "\\", "extra": )" + nested(inner + 1) + "}", false).code(), "json_too_deep");
  EXPECT_NO_THROW(check_json_depth("]]]]" + nested(kMaxRequestJsonDepth)));  // stray closers do not bank depth
  EXPECT_THROW(check_json_depth(nested(3), 2), ApiError);
}

namespace {
double metric_value(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}
}  // namespace

TEST(ServerMetrics, ExpertTiersPartitionTheRequestsWhenExpertsAreComputedInPlace) {
  // 10 requested: 2 from the host cache, 3 computed in place from resident pages, 5 read of
  // which 1 was resident. A look-ahead read 2 more that nobody asked for (experts_read 7).
  ExpertStoreStats e;
  e.experts_requested = 10;
  e.host_cache_hits = 2;
  e.experts_in_place = 3;
  e.experts_read = 7;
  e.lookahead_read = 2;
  e.page_cache_hits = 3 + 1;
  ServerMetrics m;
  m.request_done(JobResult{}, e);
  const std::string text = m.prometheus(0, false, 4);
  EXPECT_EQ(metric_value(text, "moestream_expert_requests_total"), 10);
  EXPECT_EQ(metric_value(text, "moestream_expert_hits_total{tier=\"host_cache\"}"), 2);
  EXPECT_EQ(metric_value(text, "moestream_expert_hits_total{tier=\"page_cache\"}"), 4);
  EXPECT_EQ(metric_value(text, "moestream_expert_hits_total{tier=\"storage\"}"), 4);
  EXPECT_EQ(metric_value(text, "moestream_expert_hit_ratio{tier=\"storage\"}"), 0.4);
  EXPECT_EQ(metric_value(text, "moestream_expert_reads_total"), 7);
}

TEST(ApiError, InternalErrorKeepsTheDetailOffTheClient) {
  const ApiError e = internal_error("engine_error", "read of /srv/models/x/experts/layer_000.bin failed");
  EXPECT_EQ(e.status(), 500);
  EXPECT_EQ(e.code(), "engine_error");
  const std::string client = e.body().dump();
  EXPECT_EQ(client.find('/'), std::string::npos) << client;
  EXPECT_NE(client.find("error id E"), std::string::npos) << client;
  EXPECT_NE(internal_error("x", "y").what(), std::string(e.what()));  // a new id each time
}

namespace {
std::vector<int> ids_of(const Tokenizer& tok, const std::string& s) {
  std::vector<int> out;
  for (int32_t id : tok.encode(s, false)) out.push_back(id);
  return out;
}

// A greedy job of up to 12 tokens.
JobParams greedy_job(const std::vector<int>& prompt) {
  JobParams jp;
  jp.prompt = prompt;
  jp.max_tokens = 12;
  jp.sampler.temperature = 0;
  return jp;
}

// Waits for the job's updates to its end, appending their text and (when `ids`) token ids.
void drain(Job& job, std::string* text, std::vector<int>* ids) {
  while (true) {
    auto u = job.wait(1000ms);
    *text += u.text;
    if (ids) ids->insert(ids->end(), u.ids.begin(), u.ids.end());
    if (u.done) break;
  }
}

ModelOptions options_1_thread_512() {
  ModelOptions o;
  o.n_threads = 1;
  o.max_context = 512;
  return o;
}

// Greedy continuation of each prompt in turn through one session; returns the token texts.
std::vector<std::string> run_all(Model& model, const Tokenizer& tok, bool reuse,
                                 const std::vector<std::vector<int>>& prompts, std::vector<int>* reused) {
  ServerMetrics metrics;
  EngineSession session(model, &tok, metrics, reuse);
  std::vector<std::string> out;
  for (const auto& p : prompts) {
    Job job(greedy_job(p));
    session.run(job);
    std::string text;
    drain(job, &text, nullptr);
    EXPECT_FALSE(job.error().has_value());
    out.push_back(text);
    if (reused) reused->push_back(job.result()->prompt_tokens_reused);
  }
  return out;
}
}  // namespace

TEST(EngineSession, PrefixReuseGivesTheSameTokensAsAFreshPrefill) {
  const fs::path dir = fs::path(MOESTREAM_SOURCE_DIR) / "models" / "demo";
  if (!fs::exists(dir / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model " << dir << " absent";
  auto model = Model::load(dir, options_1_thread_512());
  Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  const std::string base = "The operating system keeps a table of pages. ";
  const std::vector<std::vector<int>> prompts = {
      ids_of(tok, base + "Each page"), ids_of(tok, base + "Each page maps to a frame, and"),
      ids_of(tok, base), ids_of(tok, "Something else entirely: the disk")};
  std::vector<int> reused;
  const auto with = run_all(*model, tok, true, prompts, &reused);
  const auto without = run_all(*model, tok, false, prompts, nullptr);
  EXPECT_EQ(with, without);
  ASSERT_EQ(reused.size(), 4u);
  EXPECT_EQ(reused[0], 0);
  EXPECT_GE(reused[1], int(prompts[0].size()) - 1);  // all of the first prompt
  EXPECT_EQ(reused[2], int(prompts[2].size()) - 1);  // a prefix of the cache: only the last token runs
  EXPECT_LT(reused[3], 3);
}

TEST(EngineSession, WithoutATokenizerTheJobGetsTheTokenIdsOfTheSameReply) {
  const fs::path dir = fs::path(MOESTREAM_SOURCE_DIR) / "models" / "demo";
  if (!fs::exists(dir / "model.json")) MOESTREAM_SKIP_OR_FAIL() << "demo model " << dir << " absent";
  auto model = Model::load(dir, options_1_thread_512());
  Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
  const std::vector<int> prompt = ids_of(tok, "The operating system keeps a table of pages.");
  const std::string text = run_all(*model, tok, false, {prompt}, nullptr)[0];
  ServerMetrics metrics;
  EngineSession session(*model, nullptr, metrics, false);
  Job job(greedy_job(prompt));
  session.run(job);
  std::vector<int> ids;
  std::string no_text;
  drain(job, &no_text, &ids);
  EXPECT_EQ(no_text, "");
  ASSERT_EQ(ids.size(), 12u);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ids.begin(), ids.end()), true), text);
}

namespace {
// A connected loopback TCP pair: the accepted (server) end and the client end.
struct TcpPair {
  int listener = -1, server = -1, client = -1;
  TcpPair() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    server = accept(listener, nullptr, nullptr);
  }
  ~TcpPair() {
    for (int fd : {listener, server, client})
      if (fd >= 0) close(fd);
  }
  static int port(int fd, bool peer) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if ((peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
              : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
      return -1;
    return ntohs(a.sin_port);
  }
};
}  // namespace

TEST(ConnectionQueue, OverflowRunsFlaggedOnItsOwnThreadsAndInlineOnlyWhenThatIsFullToo) {
  // 1 HTTP thread + 1 waiting place, 1 overflow thread + 1 overflow place. While the first
  // closures block, the caller (httplib's accept thread) must not: a slow overflow client used to
  // stall accepting; only the fifth connection runs inline.
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  std::vector<std::pair<int, bool>> ran;  // (connection, overloaded())
  std::thread::id inline_thread;
  ConnectionQueue q(1, 1, 1, 1);
  auto blocking = [&](int i) {
    return [&, i] {
      {
        std::lock_guard<std::mutex> lock(mu);
        ++started;
      }
      cv.notify_all();
      open.wait();
      std::lock_guard<std::mutex> lock(mu);
      ran.emplace_back(i, ConnectionQueue::overloaded());
    };
  };
  auto wait_started = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started == n; });
  };
  q.enqueue(blocking(0));
  wait_started(1);         // on the HTTP thread
  q.enqueue(blocking(1));  // waits for it
  q.enqueue(blocking(2));
  wait_started(2);         // on the overflow thread
  q.enqueue(blocking(3));  // waits for that
  q.enqueue([&] {
    std::lock_guard<std::mutex> lock(mu);
    ran.emplace_back(4, ConnectionQueue::overloaded());
    inline_thread = std::this_thread::get_id();
  });
  EXPECT_EQ(inline_thread, std::this_thread::get_id());
  EXPECT_FALSE(ConnectionQueue::overloaded());  // the caller's flag is reset after the inline run
  gate.set_value();
  q.shutdown();  // drains both FIFOs
  std::sort(ran.begin(), ran.end());
  const std::vector<std::pair<int, bool>> want = {{0, false}, {1, false}, {2, true}, {3, true}, {4, true}};
  EXPECT_EQ(ran, want);
}

TEST(ClientConnection, FindsTheServerEndByItsAddressesNotTheClientEnd) {
  TcpPair p;
  ASSERT_GE(p.server, 0);
  const int local = TcpPair::port(p.server, false), remote = TcpPair::port(p.server, true);
  const ClientConnection c = ClientConnection::find("127.0.0.1", local, "127.0.0.1", remote);
  EXPECT_EQ(c.fd(), p.server);  // the client end has the same ports swapped: not matched
  EXPECT_EQ(ClientConnection::find("127.0.0.1", -1, "127.0.0.1", remote).fd(), p.server);
  EXPECT_FALSE(ClientConnection::find("127.0.0.1", local, "127.0.0.2", remote).found());
  EXPECT_FALSE(ClientConnection::find("127.0.0.1", local, "127.0.0.1", -1).found());
}

TEST(ClientConnection, AliveUntilThePeerClosesAndPendingBytesCountAsAlive) {
  TcpPair p;
  ASSERT_GE(p.server, 0);
  const ClientConnection c(p.server);
  EXPECT_TRUE(c.alive());
  ASSERT_EQ(write(p.client, "GET", 3), 3);  // a pipelined request: still a client
  EXPECT_TRUE(c.alive());
  EXPECT_TRUE(c.alive());  // peeking consumed nothing
  close(p.client);
  p.client = -1;
  // FIN arrives after the unread bytes; once those are read the end of stream shows.
  char buf[3];
  ASSERT_EQ(read(p.server, buf, 3), 3);
  bool closed = false;
  for (int i = 0; i < 1000 && !closed; ++i) {
    closed = !c.alive();
    if (!closed) std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(closed);
}

TEST(ClientConnection, ANotFoundConnectionCountsAsAlive) {
  EXPECT_TRUE(ClientConnection(-1).alive());
}
