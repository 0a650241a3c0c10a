// The OpenAI-compatible HTTP API over cpp-httplib: /v1/completions, /v1/chat/completions (JSON or
// server-sent events), Anthropic's /v1/messages, /v1/models, /tokenize, /detokenize, /health,
// /metrics; API key, CORS, body limit, JSON errors, 503.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/chat/chat_prompt.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

using RequestStartHook = std::function<uint64_t(int sequence, int prompt_tokens)>;

struct ServerOptions {
  std::string host = "127.0.0.1";   // loopback unless asked otherwise
  int port = 8080;                  // 0 = any free port (printed on start)
  std::string api_key;              // empty = no authentication
  std::string model_id;             // the name /v1/models lists
  size_t queue_size = 8;            // requests that may wait behind the running one
  size_t max_body_bytes = 4u << 20;
  int default_max_tokens = 256;
  bool prefix_reuse = true;
  int http_threads = 0;             // 0 = queue_size + parallel + 3
  // Accepted connections that may wait for an HTTP thread; beyond threads + this, a connection
  // is answered 503 (Retry-After) at once, once its request is read. 0 = 2 x http threads.
  size_t max_waiting_connections = 0;
  // Requests run at once (continuous batching, runtime/server/batch_scheduler.h); 1 = one at a
  // time through EngineSession, as before.
  int parallel = 1;
  // --collect-routing (issue 22): told when a request starts on a model sequence (-1: the
  // one-at-a-time forward path) with its prompt length; returns the request id its routing is
  // logged under (answered in timings.routing_request_id). Empty = no routing log.
  RequestStartHook on_request_start;
  // --replay-routing (issue 22): each request replays one request of this routing log on its
  // own sequence (runtime/server/request_replay.h), in start order or the one its body names
  // (replay_request); answered in timings.replay_request. Prefix reuse is off with it (a cached
  // prefix was computed under another request's replay). Null = the router's choice.
  std::shared_ptr<const RoutingReplay> replay;
  // The markup of the model's replies (tool calls, reasoning); nullopt = the chat template's
  // (ChatPrompt::reply_format).
  std::optional<ReplyFormat> reply_format;
  // Browser origins allowed to call the API (CORS); "*" = any; empty = no CORS headers.
  std::vector<std::string> cors_origins;
  // Test only: honour a request's forced_output (the reply's text decoded instead of sampled).
  bool allow_forced_output = false;
};

class ApiServer {
 public:
  // tok may be null (a model without a tokenizer, e.g. a synthetic one): /v1/completions then
  // takes token-id prompts only and answers the generated ids in choices[].token_ids.
  ApiServer(ServerOptions opts, Model& model, const Tokenizer* tok, std::optional<ChatPrompt> chat);
  ~ApiServer();
  // Binds (throws IoError naming host:port on failure) and returns the bound port.
  int bind();
  // Serves until stop(); blocks.
  void serve();
  // Stops accepting, answers waiting requests with 503, lets the running one finish. Thread-safe.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
