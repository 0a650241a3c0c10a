// ApiServer::Impl's Anthropic messages route (POST /v1/messages): the request as the chat request
// it means, the reply and its stream in Anthropic's shapes (runtime/server/anthropic_api.h).
#include "runtime/server/http_api_impl.h"

namespace moestream {

using namespace std::chrono_literals;

void ApiServer::Impl::handle_messages(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  std::vector<std::shared_ptr<Job>> jobs;
  CompletionRequest r;
  ReplyParserOptions reply;
  try {
    if (stopping) throw ApiError(503, "shutting_down", "the server is shutting down");
    check_json_depth(body);
    const OJ j = OJ::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw ApiError(400, "invalid_json", "request body is not valid JSON");
    const std::string chat_body = anthropic_to_chat_body(j).dump();
    r = parse_completion_request(chat_body, true, RequestLimits{opts.model_id, model.max_context()});
    jobs = submit_choices(r, &reply);
  } catch (const ApiError& e) {
    if (e.status() < 500) metrics.client_error();
    send_json(res, e.status(), anthropic_error_body(e));
    if (e.status() == 503) res.set_header("Retry-After", "1");
    return;
  }
  const std::string id = new_id("msg");
  if (r.stream) return stream_messages(jobs, id, reply, res);
  Collected c;
  if (!collect(req, jobs, res, c)) return;
  if (auto err = jobs[0]->error()) return send_json(res, err->status(), anthropic_error_body(*err));
  ReplyParser parser = reply_parser(true, reply);
  send_json(res, 200, anthropic_response(id, opts.model_id, parser, c.text[0], *jobs[0]->result()));
}

void ApiServer::Impl::stream_messages(const std::vector<std::shared_ptr<Job>>& jobs, const std::string& id,
                                      const ReplyParserOptions& reply, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  struct State {
    std::vector<char> done{0};
    AnthropicEvents events;
    ReplyParser reply;
  };
  auto st = std::make_shared<State>(State{{0}, {}, reply_parser(true, reply)});
  const int input_tokens = int(jobs[0]->params().prompt.size());
  open_streams++;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, jobs, id, st, input_tokens](size_t, httplib::DataSink& sink) {
        const Job::Update u = poll(jobs, st->done, 200ms)[0];
        std::string out = st->events.next(id, opts.model_id, input_tokens, st->reply, u.text, u.done, *jobs[0]);
        if (out.empty()) out = ": waiting\n\n";
        if (!sink.write(out.data(), out.size())) return false;
        if (u.done) sink.done();
        return true;
      },
      [this, jobs](bool) {
        for (const auto& j : jobs) queue->cancel(j);
        open_streams--;
      });
}

}  // namespace moestream
