// ApiServer::Impl::routes (runtime/server/http_api_impl.h): the route table of the HTTP API and its
// small routes (health, models, metrics, tokenize); completions and messages go to their handlers.
#include "runtime/server/http_api_impl.h"

namespace moestream {

void ApiServer::Impl::routes() {
  const int threads = opts.http_threads > 0 ? opts.http_threads : int(opts.queue_size) + std::max(1, opts.parallel) + 3;
  const size_t waiting = opts.max_waiting_connections > 0 ? opts.max_waiting_connections : 2 * size_t(threads);
  http.new_task_queue = [threads, waiting] { return new ConnectionQueue(size_t(threads), waiting); };
  http.set_payload_max_length(opts.max_body_bytes);
  // An idle keep-alive connection holds a pool thread and delays shutdown by this much.
  http.set_keep_alive_timeout(1);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // httplib runs this before it reads the body. An answer now would close the socket with the
    // body unread, and the kernel then resets the connection: the client may see the reset, not
    // our answer. Requests with a body are answered by their route once it is read (read_body(),
    // then refuse()).
    if (req.method == "PRI") {  // an HTTP/2 preface: httplib would read its body unbounded
      metrics.client_error();
      send_json(res, 400, ApiError(400, "unsupported_protocol", "this server speaks HTTP/1.1 only").body());
      return httplib::Server::HandlerResponse::Handled;
    }
    if (has_body(req) || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    return refuse(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib answers 404 (no route) and 413 (body over the limit) itself; give them JSON bodies.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    metrics.client_error();
    std::string code = "error", msg = "HTTP " + std::to_string(res.status);
    if (res.status == 404) code = "not_found", msg = "no such endpoint: " + req.method + " " + req.path;
    if (res.status == 413) {
      send_json(res, 413, body_too_large().body());
      return httplib::Server::HandlerResponse::Handled;
    }
    send_json(res, res.status, ApiError(res.status, code, msg).body());
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    metrics.request_failed();
    send_json(res, 500, internal_error("internal_error", what).body());
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, stopping ? 503 : 200, json{{"status", stopping ? "shutting_down" : "ok"}});
  });
  // A GET with a body skipped refuse() before routing.
  const json model_object{{"id", opts.model_id}, {"object", "model"}, {"created", started},
                          {"owned_by", "moestream"}, {"max_model_len", model.max_context()}};
  http.Get("/v1/models", [this, model_object](const httplib::Request& req, httplib::Response& res) {
    if (refuse(req, res)) return;
    send_json(res, 200, json{{"object", "list"}, {"data", json::array({model_object})}});
  });
  http.Get(R"(/v1/models/(.+))", [this, model_object](const httplib::Request& req, httplib::Response& res) {
    if (refuse(req, res)) return;
    if (req.matches[1] == opts.model_id) return send_json(res, 200, model_object);
    metrics.client_error();
    send_error(res, ApiError(404, "model_not_found", "model '" + req.matches[1].str() + "' does not exist; this "
                             "server serves '" + opts.model_id + "'", "model"));
  });
  enable_cors(http, opts.cors_origins);
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (refuse(req, res)) return;
    res.set_content(metrics.prometheus(queue->waiting(), queue->running(), queue->capacity()) +
                        metrics.prometheus_engine(queue->running_count()),
                    "text/plain; version=0.0.4");
  });
  // Bodies come through content readers: httplib bounds a Content-Length body by
  // set_payload_max_length, but would read a chunked one whole, however large.
  using Reader = httplib::ContentReader;
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const Reader& reader) {
    std::string body;
    if (read_body(req, res, reader, body) && !refuse(req, res)) handle(req, body, res, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const Reader& reader) {
    std::string body;
    if (read_body(req, res, reader, body) && !refuse(req, res)) handle(req, body, res, true);
  });
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res, const Reader& reader) {
    std::string body;
    if (read_body(req, res, reader, body) && !refuse(req, res)) handle_messages(req, body, res);
  });
  const auto tokenize_route = [this](json (*reply)(const std::string&, const TokenizeContext&)) {
    return [this, reply](const httplib::Request& req, httplib::Response& res, const Reader& reader) {
      std::string body;
      if (!read_body(req, res, reader, body) || refuse(req, res)) return;
      try {
        send_json(res, 200, reply(body, TokenizeContext{tok, chat ? &*chat : nullptr, opts.model_id,
                                                        model.max_context(), model.config().vocab_size}));
      } catch (const ApiError& e) {
        metrics.client_error();
        send_error(res, e);
      }
    };
  };
  http.Post("/tokenize", tokenize_route(tokenize_reply));
  http.Post("/detokenize", tokenize_route(detokenize_reply));
  // Every other request with a body: read it (bounded, so that closing does not reset the
  // connection), then 404.
  auto not_found = [this](const httplib::Request& req, httplib::Response& res, const Reader& reader) {
    std::string body;
    if (!read_body(req, res, reader, body) || refuse(req, res)) return;
    metrics.client_error();
    send_json(res, 404, ApiError(404, "not_found", "no such endpoint: " + req.method + " " + req.path).body());
  };
  http.Post(".*", not_found);
  http.Put(".*", not_found);
  http.Patch(".*", not_found);
  http.Delete(".*", not_found);
}

}  // namespace moestream
