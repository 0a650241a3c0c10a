// Implementation of runtime/server/response_json.h.
#include "runtime/server/response_json.h"

namespace moestream {

using json = nlohmann::json;

json openai_tool_call(const ToolCall& c) {
  return json{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

json openai_message(const ReplyDelta& whole) {
  json m{{"role", "assistant"}};
  m["content"] = whole.content.empty() && !whole.calls.empty() ? json(nullptr) : json(whole.content);
  if (!whole.reasoning.empty()) m["reasoning_content"] = whole.reasoning;
  if (!whole.calls.empty()) {
    json calls = json::array();
    for (const ToolCall& c : whole.calls) calls.push_back(openai_tool_call(c));
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

void add_openai_delta(json& delta, const ReplyDelta& d, int& next_call) {
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (d.calls.empty()) return;
  json calls = json::array();
  for (const ToolCall& c : d.calls) {
    json t = openai_tool_call(c);
    t["index"] = next_call++;
    calls.push_back(std::move(t));
  }
  delta["tool_calls"] = std::move(calls);
}

std::string reply_finish_reason(const std::string& engine_reason, int n_calls) {
  return n_calls > 0 && engine_reason == "stop" ? "tool_calls" : engine_reason;
}

json openai_usage(const std::vector<JobResult>& rs) {
  int completion = 0;
  for (const JobResult& r : rs) completion += r.completion_tokens;
  return json{{"prompt_tokens", rs[0].prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", rs[0].prompt_tokens + completion},
              {"prompt_tokens_details", {{"cached_tokens", rs[0].prompt_tokens_reused}}}};
}

json openai_timings(const JobResult& r) {
  json t{{"queue_s", r.queue_s}, {"prefill_s", r.prefill_s}, {"decode_s", r.decode_s},
         {"prompt_tokens_processed", r.prompt_tokens - r.prompt_tokens_reused},
         {"decode_tokens_per_s", r.decode_s > 0 && r.completion_tokens > 1 ? (r.completion_tokens - 1) / r.decode_s : 0.0}};
  if (r.routing_request_id) t["routing_request_id"] = *r.routing_request_id;
  if (r.replay_request) t["replay_request"] = *r.replay_request;
  if (r.cache_aware) {
    const CacheAwareStats& c = *r.cache_aware;
    t["cache_aware"] = json{{"substitutions", c.substitutions}, {"misses_before", c.misses_before},
                            {"misses_after", c.misses_after}, {"slots", c.slots},
                            {"agreement", c.agreement()}};
  }
  return t;
}

}  // namespace moestream
