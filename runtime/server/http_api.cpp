// Implementation of runtime/server/http_api.h: authentication, request -> job, JSON and server-sent-event
// responses (the route table: http_api_routes.cpp; the Anthropic messages route: http_api_messages.cpp;
// the state they share: http_api_impl.h). Generation itself runs on the JobQueue's worker (EngineSession).
#include "runtime/server/http_api.h"
#include "runtime/server/http_api_impl.h"

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
#include "runtime/tokenizer/model_tokenizer.h"
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

namespace {
using json = nlohmann::json;
using OJ = nlohmann::ordered_json;
using namespace std::chrono_literals;

}  // namespace

void ApiServer::Impl::send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void ApiServer::Impl::send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status(), e.body());
  if (e.status() == 503) res.set_header("Retry-After", "1");
}

std::string ApiServer::Impl::new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%04llx", prefix, (unsigned long long)salt,
                (unsigned long long)(counter++ & 0xffff));
  return buf;
}

ApiServer::Impl::Impl(ServerOptions o, Model& m, const Tokenizer* t, std::optional<ChatPrompt> c)
    : opts(no_reuse_with_replay(std::move(o))), model(m), tok(t), chat(std::move(c)),
      session(m, t, metrics, opts.prefix_reuse),
      eos_ids(end_of_turn_ids(m.config().eos_token_id, t)), constraints(t, m.config().vocab_size, eos_ids) {
  if (opts.replay) replays.emplace(opts.replay);
  session.set_request_start_hook(opts.on_request_start);
  session.set_replays(replays ? &*replays : nullptr);
  if (opts.parallel > 1) {
    auto batch = std::make_unique<BatchScheduler>(m, t, metrics, opts.queue_size, opts.parallel, opts.prefix_reuse);
    batch->set_request_start_hook(opts.on_request_start);
    batch->set_replays(replays ? &*replays : nullptr);
    queue = std::move(batch);
  } else
    queue = std::make_unique<JobQueue>(opts.queue_size, [this](Job& j) { session.run(j); },
                                       [this](const Job&) { metrics.request_cancelled_waiting(); });
  routes();
}

ServerOptions ApiServer::Impl::no_reuse_with_replay(ServerOptions o) {
  if (o.replay) o.prefix_reuse = false;
  return o;
}

bool ApiServer::Impl::has_body(const httplib::Request& req) {
  return std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) != 0 ||
         req.has_header("Transfer-Encoding");
}

bool ApiServer::Impl::refuse(const httplib::Request& req, httplib::Response& res) {
  if (ConnectionQueue::overloaded()) {
    // Every HTTP thread is busy and the connection FIFO is full: this runs on an overflow
    // thread (or the accept thread); answer at once and close the connection.
    metrics.request_rejected();
    send_error(res, ApiError(503, "server_overloaded",
                             "the server is busy: all HTTP connections are in use; retry later"));
    res.set_header("Connection", "close");
    return true;
  }
  // A CORS preflight never carries credentials.
  if (req.path == "/health" || req.method == "OPTIONS" || authorized(req)) return false;
  metrics.client_error();
  send_json(res, 401, ApiError(401, "invalid_api_key", "missing or wrong API key: send 'Authorization: Bearer KEY'").body());
  return true;
}

bool ApiServer::Impl::authorized(const httplib::Request& req) const {
  if (opts.api_key.empty()) return true;
  const std::string want = "Bearer " + opts.api_key;
  return req.get_header_value("Authorization") == want || req.get_header_value("x-api-key") == opts.api_key;
}

ReplyFormat ApiServer::Impl::reply_format() const {
  return opts.reply_format ? *opts.reply_format : chat ? chat->reply_format() : ReplyFormat::kPlain;
}

ReplyParser ApiServer::Impl::reply_parser(bool chat_endpoint, ReplyParserOptions o) const {
  o.id_prefix = new_id("call") + "-";
  return ReplyParser(chat_endpoint ? reply_format() : ReplyFormat::kPlain, std::move(o));
}

JobParams ApiServer::Impl::job_params(const CompletionRequest& r, ReplyParserOptions* reply) {
  JobParams p;
  if (!tok && (r.chat || r.prompt_ids.empty()))
    throw ApiError(400, "no_tokenizer", "this model has no tokenizer: send the prompt to /v1/completions as a "
                   "list of token ids", r.chat ? "messages" : "prompt");
  if (!tok && !r.stop.empty())
    throw ApiError(400, "no_tokenizer", "this model has no tokenizer: stop strings cannot be matched", "stop");
  if (r.chat) {
    if (!chat || !chat->has_template())
      throw ApiError(400, "no_chat_template", "this model has no chat template; use /v1/completions");
    std::string text;
    try {
      text = chat->render(r.messages, true, r.tools, r.template_kwargs);
    } catch (const ChatTemplateError& e) {
      throw ApiError(400, "chat_template_error", e.what(), "messages");
    }
    try {
      for (int32_t id : tok->encode(text, /*add_special_tokens=*/false)) p.prompt.push_back(id);
    } catch (const Error& e) {
      throw ApiError(400, "invalid_text", e.what(), "messages");
    }
    p.keep_special_tokens = reply_format() != ReplyFormat::kPlain;  // the parser takes the markup apart
    if (reply) {
      reply->parse_tool_calls = r.parse_tool_calls;
      reply->tools = r.tools;
      reply->starts_in_reasoning = prompt_opens_reasoning(text);
    }
  } else if (!r.prompt_ids.empty()) {
    for (int id : r.prompt_ids)
      if (id >= model.config().vocab_size)
        throw ApiError(400, "invalid_request_error", "prompt: token id " + std::to_string(id) +
                                                         " is outside the vocabulary of " +
                                                         std::to_string(model.config().vocab_size), "prompt");
    p.prompt = r.prompt_ids;
  } else {
    try {
      for (int32_t id : tok->encode(r.prompt, /*add_special_tokens=*/true)) p.prompt.push_back(id);
    } catch (const Error& e) {
      throw ApiError(400, "invalid_text", e.what(), "prompt");
    }
  }
  if (p.prompt.empty()) throw ApiError(400, "empty_prompt", "the prompt encodes to no tokens", r.chat ? "messages" : "prompt");
  const int ctx = model.max_context();
  const int n_prompt = int(p.prompt.size());
  if (n_prompt >= ctx)
    throw ApiError(400, "context_length_exceeded", "the prompt has " + std::to_string(n_prompt) +
                   " tokens; the context holds " + std::to_string(ctx) + " (prompt + max_tokens)",
                   r.chat ? "messages" : "prompt");
  p.max_tokens = r.max_tokens ? *r.max_tokens : std::min(opts.default_max_tokens, ctx - n_prompt);
  if (n_prompt + p.max_tokens > ctx)
    throw ApiError(400, "context_length_exceeded", "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                   std::to_string(p.max_tokens) + ") exceed the context of " + std::to_string(ctx), "max_tokens");
  p.sampler.temperature = r.temperature;
  p.sampler.top_p = r.top_p;
  p.sampler.top_k = r.top_k;
  p.sampler.seed = r.seed ? *r.seed : std::random_device{}();
  p.sampler.min_p = r.min_p;
  p.sampler.typical_p = r.typical_p;
  p.sampler.repeat_penalty = r.repeat_penalty;
  p.sampler.repeat_last_n = r.repeat_last_n;
  p.sampler.presence_penalty = r.presence_penalty;
  p.sampler.frequency_penalty = r.frequency_penalty;
  p.sampler.logit_bias = r.logit_bias;
  size_t bans = 0;
  for (const LogitBias& b : r.logit_bias) {
    if (b.id >= model.config().vocab_size)
      throw ApiError(400, "invalid_request_error", "logit_bias: token id " + std::to_string(b.id) +
                     " is outside the vocabulary of " + std::to_string(model.config().vocab_size),
                     "logit_bias." + std::to_string(b.id));
    bans += b.bias == kLogitBan;
  }
  if (bans >= size_t(model.config().vocab_size))
    throw ApiError(400, "invalid_request_error", "logit_bias bans every token", "logit_bias");
  p.logprobs = r.logprobs ? r.top_logprobs : -1;
  if (!r.ignore_eos) p.stop_ids = eos_ids;
  p.constraint = constraints.compile(r, reply_format(), p.prompt);
  if (r.forced_output) {
    if (!opts.allow_forced_output)
      throw ApiError(400, "invalid_request_error", "forced_output is a test hook: the server must run with " +
                     option_ref("test_forced_output"), "forced_output");
    if (!tok) throw ApiError(400, "no_tokenizer", "forced_output needs a tokenizer", "forced_output");
    for (int32_t id : tok->encode(*r.forced_output, /*add_special_tokens=*/false)) p.forced.push_back(id);
    if (!eos_ids.empty()) p.forced.push_back(eos_ids[0]);  // then the turn ends
  }
  p.stop = r.stop;
  if (r.replay_request) {
    if (!replays)
      throw ApiError(400, "invalid_request_error", "replay_request needs a server started with " + option_ref("replay_routing"),
                     "replay_request");
    if (uint64_t(*r.replay_request) >= replays->n_requests())
      throw ApiError(400, "invalid_request_error", "replay_request " + std::to_string(*r.replay_request) +
                     " is outside the routing log's " + std::to_string(replays->n_requests()) + " requests",
                     "replay_request");
    p.replay_request = size_t(*r.replay_request);
  }
  return p;
}

json ApiServer::Impl::chunk(bool chat, const std::string& id, size_t index, json body, const json& finish,
                            const std::vector<int>& ids, const json& logprobs) const {
  json choice{{"index", index}, {"finish_reason", finish}};
  if (chat) {
    choice["delta"] = std::move(body);
    if (!logprobs.is_null()) choice["logprobs"] = logprobs;
  } else {
    choice["text"] = std::move(body);
    choice["logprobs"] = logprobs;
    if (!tok) choice["token_ids"] = ids;
  }
  return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", std::time(nullptr)}, {"model", opts.model_id}, {"choices", json::array({choice})}};
}

std::string ApiServer::Impl::sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

ApiError ApiServer::Impl::body_too_large() const {
  return ApiError(413, "body_too_large", "request body exceeds the limit of " + std::to_string(opts.max_body_bytes) +
                                             " bytes");
}

bool ApiServer::Impl::read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                                std::string& body) {
  if (req.is_multipart_form_data()) {  // httplib would need a multipart receiver
    metrics.client_error();
    send_json(res, 415, ApiError(415, "unsupported_media_type", "the request body must be JSON, not multipart "
                                 "form data").body());
    return false;
  }
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (n > opts.max_body_bytes - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (ok) return true;
  metrics.client_error();
  if (too_large || res.status == 413) send_json(res, 413, body_too_large().body());
  else send_json(res, 400, ApiError(400, "invalid_body", "the request body could not be read: cut off, or a "
                                    "malformed chunked encoding").body());
  return false;
}

std::vector<std::shared_ptr<Job>> ApiServer::Impl::submit_choices(const CompletionRequest& r, ReplyParserOptions* reply) {
  const size_t most = queue->capacity() + size_t(std::max(1, opts.parallel));
  if (size_t(r.n) > most)
    throw ApiError(400, "invalid_request_error", "n: " + std::to_string(r.n) + " choices exceed the " +
                   std::to_string(most) + " requests this server holds at once (" + option_ref("queue_size") + " + " + option_ref("parallel") + ")", "n");
  const JobParams base = job_params(r, reply);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < r.n; ++i) {
    JobParams p = base;
    if (i > 0) p.sampler.seed = r.seed ? *r.seed + uint64_t(i) : std::random_device{}();
    jobs.push_back(std::make_shared<Job>(std::move(p)));
    if (!queue->submit(jobs.back())) {
      for (const auto& j : jobs) queue->cancel(j);
      metrics.request_rejected();
      throw ApiError(503, "queue_full", "the server is busy: " + std::to_string(queue->capacity()) +
                                            " requests are already waiting; retry later");
    }
  }
  return jobs;
}

std::vector<Job::Update> ApiServer::Impl::poll(const std::vector<std::shared_ptr<Job>>& jobs, std::vector<char>& done,
                                               std::chrono::milliseconds timeout) {
  std::vector<Job::Update> out(jobs.size());
  bool news = false;
  for (int pass = 0; pass < 2 && !news; ++pass)
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (done[i]) continue;
      out[i] = jobs[i]->wait(pass == 0 ? 0ms : timeout);
      done[i] = out[i].done;
      news = news || out[i].done || !out[i].text.empty() || !out[i].ids.empty() || !out[i].tokens.empty();
      if (pass == 1) break;
    }
  return out;
}

bool ApiServer::Impl::all(const std::vector<char>& done) { return std::find(done.begin(), done.end(), 0) == done.end(); }
                          
                          std::vector<JobResult> ApiServer::Impl::results(const std::vector<std::shared_ptr<Job>>& jobs) {
  std::vector<JobResult> rs;
  for (const auto& j : jobs) rs.push_back(*j->result());
  return rs;
}

void ApiServer::Impl::handle(const httplib::Request& req, const std::string& body, httplib::Response& res, bool chat_endpoint) {
  std::vector<std::shared_ptr<Job>> jobs;
  CompletionRequest r;
  ReplyParserOptions reply;
  try {
    if (stopping) throw ApiError(503, "shutting_down", "the server is shutting down");
    r = parse_completion_request(body, chat_endpoint, RequestLimits{opts.model_id, model.max_context()});
    jobs = submit_choices(r, &reply);
  } catch (const ApiError& e) {
    if (e.status() < 500) metrics.client_error();
    send_error(res, e);
    return;
  }
  const std::string id = new_id(chat_endpoint ? "chatcmpl" : "cmpl");
  if (r.stream) stream(jobs, id, chat_endpoint, r, reply, res);
  else respond(req, jobs, id, chat_endpoint, r, reply, res);
}

bool ApiServer::Impl::collect(const httplib::Request& req, const std::vector<std::shared_ptr<Job>>& jobs, httplib::Response& res,
                              Collected& c) {
  // Nothing is written until the end, so a client that leaves is seen by probing its socket:
  // between tokens, and every 100 ms while the jobs wait in the queue.
  const ClientConnection client =
      ClientConnection::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  const size_t n = jobs.size();
  c.text.assign(n, "");
  c.ids.assign(n, {});
  c.tokens.assign(n, {});
  std::vector<char> done(n, 0);
  while (true) {
    std::vector<Job::Update> u = poll(jobs, done, 100ms);
    for (size_t i = 0; i < n; ++i) {
      c.text[i] += u[i].text;
      c.ids[i].insert(c.ids[i].end(), u[i].ids.begin(), u[i].ids.end());
      c.tokens[i].insert(c.tokens[i].end(), u[i].tokens.begin(), u[i].tokens.end());
    }
    if (all(done)) return true;
    if (!client.alive()) {
      // The worker stops after the current token (counted there as cancelled); a waiting job
      // gives back its place at once. Nobody reads an answer: return without waiting.
      for (const auto& j : jobs) queue->cancel(j);
      // nginx's 499 "client closed request": only httplib's (failing) write ever sees it.
      send_json(res, 499, ApiError(499, "client_closed_request", "the client closed the connection").body());
      res.set_header("Connection", "close");
      return false;
    }
  }
}

void ApiServer::Impl::respond(const httplib::Request& req, const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id,
                              bool chat_endpoint, const CompletionRequest& r, const ReplyParserOptions& reply,
                              httplib::Response& res) {
  Collected c;
  if (!collect(req, jobs, res, c)) return;
  for (const auto& j : jobs)
    if (auto err = j->error()) {
      send_error(res, *err);
      return;
    }
  const std::vector<JobResult> rs = results(jobs);
  json choices = json::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    json choice{{"index", i}, {"finish_reason", rs[i].finish_reason}};
    if (chat_endpoint) {
      ReplyParser parser = reply_parser(true, reply);
      ReplyDelta whole = parser.feed(c.text[i]);
      whole.append(parser.finish());
      choice["message"] = openai_message(whole);
      choice["finish_reason"] = reply_finish_reason(rs[i].finish_reason, parser.n_calls());
    } else {
      choice["text"] = c.text[i];
    }
    choice["logprobs"] = r.logprobs ? LogprobsJson(tok, chat_endpoint).next(c.tokens[i]) : json(nullptr);
    if (!tok) choice["token_ids"] = c.ids[i];
    choices.push_back(std::move(choice));
  }
  send_json(res, 200, json{{"id", id}, {"object", chat_endpoint ? "chat.completion" : "text_completion"},
                           {"created", std::time(nullptr)}, {"model", opts.model_id},
                           {"choices", std::move(choices)}, {"usage", openai_usage(rs)}, {"timings", openai_timings(rs[0])}});
}

void ApiServer::Impl::stream(const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id, bool chat_endpoint,
                             const CompletionRequest& r, const ReplyParserOptions& reply, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  struct State {
    std::vector<char> done, first;
    std::vector<LogprobsJson> logprobs;
    std::vector<ReplyParser> replies;  // chat: each choice's text split into content, reasoning, calls
    std::vector<int> next_call;
  };
  auto st = std::make_shared<State>();
  st->done.assign(jobs.size(), 0);
  st->first.assign(jobs.size(), 1);
  st->logprobs.assign(jobs.size(), LogprobsJson(tok, chat_endpoint));
  for (size_t i = 0; i < jobs.size(); ++i) st->replies.push_back(reply_parser(chat_endpoint, reply));
  st->next_call.assign(jobs.size(), 0);
  open_streams++;
  const bool include_usage = r.include_usage, want_logprobs = r.logprobs;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, jobs, id, chat_endpoint, st, include_usage, want_logprobs](size_t, httplib::DataSink& sink) {
        // A comment line every 200 ms while nothing comes: a client that left makes the write
        // fail, which cancels the jobs and frees their places in the queue.
        std::vector<Job::Update> us = poll(jobs, st->done, 200ms);
        std::string out;
        bool failed = false;
        for (size_t i = 0; i < jobs.size(); ++i) {
          const Job::Update& u = us[i];
          json body = u.text;
          bool news = !u.text.empty();
          if (chat_endpoint) {  // markup that may start a tool call is held back by the parser
            ReplyDelta d = st->replies[i].feed(u.text);
            if (u.done) d.append(st->replies[i].finish());
            body = json::object();
            if (st->first[i]) body["role"] = "assistant";
            add_openai_delta(body, d, st->next_call[i]);
            if (st->first[i] && !body.contains("content")) body["content"] = "";
            news = !d.empty() || (st->first[i] && !u.done);
          }
          if (news || !u.ids.empty() || !u.tokens.empty()) {
            const json lp = want_logprobs && !u.tokens.empty() ? st->logprobs[i].next(u.tokens) : json(nullptr);
            out += sse(chunk(chat_endpoint, id, i, std::move(body), nullptr, u.ids, lp));
            st->first[i] = false;
          }
          if (!u.done) continue;
          if (auto err = jobs[i]->error()) {
            out += sse(err->body());
            continue;
          }
          const std::string reason = reply_finish_reason(jobs[i]->result()->finish_reason, st->replies[i].n_calls());
          out += sse(chunk(chat_endpoint, id, i, chat_endpoint ? json::object() : json(""), reason));
        }
        const bool finished = all(st->done);
        if (out.empty() && !finished) out = ": waiting\n\n";
        if (finished) {
          for (const auto& j : jobs) failed = failed || j->error();
          if (include_usage && !failed) {
            const std::vector<JobResult> rs = results(jobs);
            json last = chunk(chat_endpoint, id, 0, chat_endpoint ? json::object() : json(""), nullptr);
            last["choices"] = json::array();
            last["usage"] = openai_usage(rs);
            last["timings"] = openai_timings(rs[0]);
            out += sse(last);
          }
          out += "data: [DONE]\n\n";
        }
        if (!sink.write(out.data(), out.size())) return false;
        if (finished) sink.done();
        return true;
      },
      [this, jobs](bool) {
        for (const auto& j : jobs) queue->cancel(j);  // after the end a no-op; on a disconnect it frees the slots
        open_streams--;
      });
}

ApiServer::ApiServer(ServerOptions opts, Model& model, const Tokenizer* tok, std::optional<ChatPrompt> chat)
    : impl_(std::make_unique<Impl>(std::move(opts), model, tok, std::move(chat))) {}

ApiServer::~ApiServer() { stop(); }

int ApiServer::bind() {
  auto& o = impl_->opts;
  // httplib listens with a backlog of 5; while the accept thread is busy (an overflow connection
  // served inline), a burst beyond that would wait for SYN retransmits (seconds). Keep the socket
  // to raise it.
  auto listen_fd = std::make_shared<int>(-1);
  impl_->http.set_socket_options([listen_fd](int fd) {
    httplib::default_socket_options(fd);
    *listen_fd = fd;
  });
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw IoError("cannot bind " + o.host + " to a free port");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw IoError("cannot bind " + o.host + ":" + std::to_string(port) + " (in use, or not a local address)");
  }
  // listen() again on a listening socket only changes its backlog (Linux); the kernel caps it at
  // net.core.somaxconn.
  if (*listen_fd >= 0) ::listen(*listen_fd, 1024);
  return port;
}

void ApiServer::serve() { impl_->http.listen_after_bind(); }

void ApiServer::stop() {
  if (impl_->stopping.exchange(true)) return;
  impl_->queue->shutdown();  // waiting jobs get 503; the running one finishes
  // httplib cuts chunked responses once stopped: let the streams of finished jobs drain first
  // (bounded, in case a client stops reading).
  for (int i = 0; i < 500 && impl_->open_streams > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->http.stop();
}

}  // namespace moestream
