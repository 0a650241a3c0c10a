// Implementation of runtime/server/reply_json.h.
#include "runtime/server/reply_json.h"

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

}  // namespace moestream
