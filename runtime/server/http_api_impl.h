// Private to runtime/server: the state and handlers behind ApiServer, shared by http_api.cpp
// (requests -> jobs, replies), http_api_routes.cpp (the route table and its small routes) and
// http_api_messages.cpp (the Anthropic messages route).
#pragma once

#include "runtime/server/http_api.h"
#include <httplib.h>
#include <sys/socket.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <thread>
#include "runtime/server/anthropic_api.h"
#include "runtime/server/client_connection.h"
#include "runtime/server/completion_request.h"
#include "runtime/server/batch_scheduler.h"
#include "runtime/server/connection_queue.h"
#include "runtime/server/cors.h"
#include "runtime/server/engine_session.h"
#include "runtime/server/job_queue.h"
#include "runtime/server/logprobs_json.h"
#include "runtime/server/request_constraint.h"
#include "runtime/server/response_json.h"
#include "runtime/server/server_metrics.h"
#include "common/option_ref.h"
#include "runtime/server/tokenize_api.h"

namespace moestream {

struct ApiServer::Impl {
  using json = nlohmann::json;
  using OJ = nlohmann::ordered_json;

  ServerOptions opts;
  Model& model;
  const Tokenizer* tok;  // null: token ids in and out
  std::optional<ChatPrompt> chat;
  ServerMetrics metrics;
  std::optional<RequestReplays> replays;  // `replay_routing`
  EngineSession session;
  std::unique_ptr<JobRunner> queue;  // JobQueue over session, or a BatchScheduler (`parallel`)
  httplib::Server http;
  std::vector<int> eos_ids;
  const std::time_t started = std::time(nullptr);
  std::atomic<bool> stopping{false};
  std::atomic<int> open_streams{0};  // SSE responses not yet fully written
  RequestConstraints constraints;  // response_format, grammar, forced tool_choice

  Impl(ServerOptions o, Model& m, const Tokenizer* t, std::optional<ChatPrompt> c);

  // A cached prefix was computed under the replay of the request that left it: another request
  // replays other experts, so its output would depend on what ran before it.
  static ServerOptions no_reuse_with_replay(ServerOptions o);

  static bool has_body(const httplib::Request& req);

  // Answers 503 (an overflow connection) or 401 (a wrong API key) when due; false when the request
  // may go on.
  bool refuse(const httplib::Request& req, httplib::Response& res);

  bool authorized(const httplib::Request& req) const;

  void routes();

  ReplyFormat reply_format() const;

  // A chat reply's parser (plain text for completions); call ids unique to the choice.
  ReplyParser reply_parser(bool chat_endpoint, ReplyParserOptions o) const;

  // Request -> job parameters; throws ApiError for anything the client got wrong. `reply` gets
  // what the chat reply's parser needs to know of the request and its prompt.
  JobParams job_params(const CompletionRequest& r, ReplyParserOptions* reply = nullptr);

  // `body`: chat, the delta object; completions, the text.
  json chunk(bool chat, const std::string& id, size_t index, json body, const json& finish,
             const std::vector<int>& ids = {}, const json& logprobs = nullptr) const;

  static std::string sse(const json& j);

  ApiError body_too_large() const;

  // Reads the whole body, at most opts.max_body_bytes; false when an error was answered.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body);

  // One job per choice (n), choice i sampling with seed + i, so a seeded request is reproducible;
  // they run as any requests do (side by side with `parallel`). All or none are queued.
  std::vector<std::shared_ptr<Job>> submit_choices(const CompletionRequest& r, ReplyParserOptions* reply = nullptr);

  // News from the unfinished jobs (done[i] is set as each ends): every one is asked at once, and
  // only when none has any is the first unfinished one waited on, up to `timeout`.
  static std::vector<Job::Update> poll(const std::vector<std::shared_ptr<Job>>& jobs, std::vector<char>& done,
                                       std::chrono::milliseconds timeout);

  static bool all(const std::vector<char>& done);

  static std::vector<JobResult> results(const std::vector<std::shared_ptr<Job>>& jobs);

  // `body`: the request's, read by read_body.
  void handle(const httplib::Request& req, const std::string& body, httplib::Response& res, bool chat_endpoint);

  struct Collected {
    std::vector<std::string> text;
    std::vector<std::vector<int>> ids;
    std::vector<std::vector<SampledToken>> tokens;
  };

  // Waits for the jobs' whole output; false (and the jobs cancelled) when the client left.
  bool collect(const httplib::Request& req, const std::vector<std::shared_ptr<Job>>& jobs, httplib::Response& res,
               Collected& c);

  void respond(const httplib::Request& req, const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id,
               bool chat_endpoint, const CompletionRequest& r, const ReplyParserOptions& reply,
               httplib::Response& res);

  void stream(const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id, bool chat_endpoint,
              const CompletionRequest& r, const ReplyParserOptions& reply, httplib::Response& res);

  // POST /v1/messages (Anthropic): the request as the chat request it means, the reply in
  // Anthropic's shapes (runtime/server/anthropic_api.h).
  void handle_messages(const httplib::Request& req, const std::string& body, httplib::Response& res);

  void stream_messages(const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id,
                       const ReplyParserOptions& reply, httplib::Response& res);

  static void send_json(httplib::Response& res, int status, const json& body);
  // The error as JSON; 503 adds Retry-After.
  static void send_error(httplib::Response& res, const ApiError& e);
  // "prefix-<salt><counter>": unique within the process, unlikely to repeat across restarts.
  static std::string new_id(const char* prefix);
};

}  // namespace moestream
