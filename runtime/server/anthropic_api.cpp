// Implementation of runtime/server/anthropic_api.h.
#include "runtime/server/anthropic_api.h"

#include <algorithm>
#include <string_view>

namespace moestream {

namespace {
using json = nlohmann::json;
using OJ = nlohmann::ordered_json;

// Fields passed on as they are (the chat endpoint checks their values), then our extensions.
constexpr std::string_view kPassed[] = {"model", "max_tokens", "stream", "temperature", "top_p", "top_k",
                                        "seed", "chat_template_kwargs", "forced_output"};
// Known fields of the Messages API this server does not do.
constexpr std::string_view kRefused[] = {"thinking", "service_tier", "container", "mcp_servers", "context_management",
                                         "output_config", "inference_geo", "speed", "diagnostics", "user_profile_id",
                                         "workspace_id"};

// Block keys that change nothing here: prompt caching is automatic (KV prefix reuse).
bool no_op_key(const std::string& k) { return k == "cache_control" || k == "citations"; }

void check_keys(const OJ& o, const std::string& name, std::initializer_list<std::string_view> allowed) {
  for (const auto& item : o.items()) {
    const std::string& k = item.key();
    if (no_op_key(k) || std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
    bad_param(name + "." + k, "unknown or unsupported field");
  }
}

std::string text_of(const OJ& block, const std::string& name) {
  check_keys(block, name, {"type", "text"});
  if (!block.contains("text") || !block["text"].is_string()) bad_param(name + ".text", "must be a string");
  return block["text"].get<std::string>();
}

// tool_result content: a string or text blocks.
std::string result_text(const OJ& c, const std::string& name) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_param(name, "must be a string or a list of text blocks");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string bn = name + "[" + std::to_string(i) + "]";
    if (!c[i].is_object() || c[i].value("type", OJ("")) != "text") bad_param(bn + ".type", "only text blocks are supported");
    out += text_of(c[i], bn);
  }
  return out;
}

// One Messages message -> the chat messages it means (appended to `out`).
void convert_message(const OJ& m, const std::string& name, OJ& out) {
  if (!m.is_object()) bad_param(name, "must be an object");
  check_keys(m, name, {"role", "content"});
  const std::string role = m.value("role", OJ("")).is_string() ? m.value("role", std::string()) : "";
  if (role != "user" && role != "assistant") bad_param(name + ".role", "must be \"user\" or \"assistant\"");
  if (!m.contains("content")) bad_param(name + ".content", "is required");
  const OJ& c = m["content"];
  if (c.is_string()) {
    out.push_back(OJ{{"role", role}, {"content", c}});
    return;
  }
  if (!c.is_array()) bad_param(name + ".content", "must be a string or a list of content blocks");
  std::string text, thinking;
  OJ calls = OJ::array();
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string bn = name + ".content[" + std::to_string(i) + "]";
    const OJ& b = c[i];
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) bad_param(bn + ".type", "must be a string");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      text += text_of(b, bn);
    } else if (type == "thinking" && role == "assistant") {
      check_keys(b, bn, {"type", "thinking", "signature"});
      if (!b.contains("thinking") || !b["thinking"].is_string()) bad_param(bn + ".thinking", "must be a string");
      thinking += b["thinking"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant") {
      check_keys(b, bn, {"type", "id", "name", "input"});
      if (!b.contains("id") || !b["id"].is_string()) bad_param(bn + ".id", "must be a string");
      if (!b.contains("name") || !b["name"].is_string()) bad_param(bn + ".name", "must be a string");
      if (!b.contains("input") || !b["input"].is_object()) bad_param(bn + ".input", "must be an object");
      calls.push_back(OJ{{"id", b["id"]}, {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", b["input"].dump()}}}});
    } else if (type == "tool_result" && role == "user") {
      check_keys(b, bn, {"type", "tool_use_id", "content", "is_error"});
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) bad_param(bn + ".tool_use_id", "must be a string");
      std::string result = result_text(b.value("content", OJ(nullptr)), bn + ".content");
      if (b.contains("is_error") && !b["is_error"].is_null()) {
        if (!b["is_error"].is_boolean()) bad_param(bn + ".is_error", "must be true or false");
        // A chat template has no error flag: the model reads it in the result's text.
        if (b["is_error"].get<bool>()) result = "Error: " + result;
      }
      out.push_back(OJ{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else {
      bad_param(bn + ".type", "'" + type + "' blocks are not supported in a" + (role == "user" ? " user" : "n assistant") +
                            " message (text" + (role == "user" ? ", tool_result" : ", thinking, tool_use") + ")");
    }
  }
  if (role == "user") {
    if (!text.empty()) out.push_back(OJ{{"role", "user"}, {"content", text}});
    return;
  }
  OJ msg{{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(std::move(msg));
}

OJ convert_tools(const OJ& tools) {
  if (!tools.is_array()) bad_param("tools", "must be a list");
  OJ out = OJ::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string tn = "tools[" + std::to_string(i) + "]";
    const OJ& t = tools[i];
    if (!t.is_object()) bad_param(tn, "must be an object");
    if (t.contains("type") && t["type"] != "custom")
      bad_param(tn + ".type", "only client tools (name, description, input_schema) are supported, not " + t["type"].dump());
    check_keys(t, tn, {"type", "name", "description", "input_schema"});
    if (!t.contains("name") || !t["name"].is_string()) bad_param(tn + ".name", "must be a string");
    if (!t.contains("input_schema") || !t["input_schema"].is_object()) bad_param(tn + ".input_schema", "must be an object");
    OJ f{{"name", t["name"]}};
    if (t.contains("description")) {
      if (!t["description"].is_string()) bad_param(tn + ".description", "must be a string");
      f["description"] = t["description"];
    }
    f["parameters"] = t["input_schema"];
    out.push_back(OJ{{"type", "function"}, {"function", f}});
  }
  return out;
}

std::string convert_tool_choice(const OJ& tc) {
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string()) bad_param("tool_choice", "must be {\"type\": ...}");
  check_keys(tc, "tool_choice", {"type", "name", "disable_parallel_tool_use"});
  if (tc.contains("disable_parallel_tool_use") && tc["disable_parallel_tool_use"] != false)
    bad_param("tool_choice.disable_parallel_tool_use", "only false is supported");
  const std::string type = tc["type"].get<std::string>();
  if (type == "auto" || type == "none") return type;
  if (type == "any" || type == "tool")
    bad_param("tool_choice", "\"any\" and \"tool\" need constrained decoding, which this server does not have yet; use "
                       "\"auto\" or \"none\"");
  bad_param("tool_choice.type", "must be auto, any, tool or none");
}
}  // namespace

OJ anthropic_to_chat_body(const OJ& body) {
  if (!body.is_object()) throw ApiError(400, "invalid_json", "request body must be a JSON object");
  OJ chat = OJ::object();
  for (const auto& item : body.items()) {
    const std::string& k = item.key();
    if (item.value().is_null()) continue;
    if (std::find(std::begin(kRefused), std::end(kRefused), k) != std::end(kRefused))
      bad_param(k, "is not supported by this server");
    const bool known = std::find(std::begin(kPassed), std::end(kPassed), k) != std::end(kPassed) ||
                       k == "messages" || k == "system" || k == "tools" || k == "tool_choice" ||
                       k == "stop_sequences" || k == "metadata" || no_op_key(k);
    if (!known) bad_param(k, "unknown field for /v1/messages (docs/server.md lists the fields this server takes)");
    if (std::find(std::begin(kPassed), std::end(kPassed), k) != std::end(kPassed)) chat[k] = item.value();
  }
  if (!body.contains("max_tokens") || body["max_tokens"].is_null()) bad_param("max_tokens", "is required");
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    bad_param("messages", "must be a non-empty list");
  OJ messages = OJ::array();
  if (body.contains("system") && !body["system"].is_null()) {
    const OJ& s = body["system"];
    std::string text;
    if (s.is_string()) {
      text = s.get<std::string>();
    } else if (s.is_array()) {
      for (size_t i = 0; i < s.size(); ++i) {
        const std::string bn = "system[" + std::to_string(i) + "]";
        if (!s[i].is_object() || s[i].value("type", OJ("")) != "text") bad_param(bn + ".type", "must be \"text\"");
        text += text_of(s[i], bn);
      }
    } else {
      bad_param("system", "must be a string or a list of text blocks");
    }
    messages.push_back(OJ{{"role", "system"}, {"content", text}});
  }
  for (size_t i = 0; i < body["messages"].size(); ++i)
    convert_message(body["messages"][i], "messages[" + std::to_string(i) + "]", messages);
  chat["messages"] = std::move(messages);
  if (body.contains("tools") && !body["tools"].is_null()) chat["tools"] = convert_tools(body["tools"]);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null())
    chat["tool_choice"] = convert_tool_choice(body["tool_choice"]);
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    const OJ& s = body["stop_sequences"];
    if (!s.is_array() || s.size() > 4) bad_param("stop_sequences", "must be a list of at most 4 strings");
    for (size_t i = 0; i < s.size(); ++i)
      if (!s[i].is_string() || s[i].get<std::string>().empty())
        bad_param("stop_sequences[" + std::to_string(i) + "]", "must be a non-empty string");
    if (!s.empty()) chat["stop"] = s;
  }
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    const OJ& m = body["metadata"];
    if (!m.is_object()) bad_param("metadata", "must be an object");
    check_keys(m, "metadata", {"user_id"});
    if (m.contains("user_id") && !m["user_id"].is_null()) chat["user"] = m["user_id"];
  }
  return chat;
}

std::string anthropic_stop_reason(const std::string& finish_reason, bool stop_string, int n_calls) {
  if (finish_reason == "length") return "max_tokens";
  if (n_calls > 0) return "tool_use";
  return stop_string ? "stop_sequence" : "end_turn";
}

json anthropic_message(const std::string& id, const std::string& model, const ReplyDelta& whole,
                       const std::string& stop_reason, const std::string& stop_sequence, const AnthropicUsage& usage) {
  json content = json::array();
  if (!whole.reasoning.empty())
    content.push_back(json{{"type", "thinking"}, {"thinking", whole.reasoning}, {"signature", ""}});
  if (!whole.content.empty() || (whole.calls.empty() && whole.reasoning.empty()))
    content.push_back(json{{"type", "text"}, {"text", whole.content}});
  for (const ToolCall& c : whole.calls)
    content.push_back(json{{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::parse(c.arguments)}});
  return json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", std::move(content)},
              {"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)},
              {"usage", {{"input_tokens", usage.input_tokens}, {"output_tokens", usage.output_tokens}}}};
}

json anthropic_response(const std::string& id, const std::string& model, ReplyParser& reply, const std::string& text,
                        const JobResult& r) {
  ReplyDelta whole = reply.feed(text);
  whole.append(reply.finish());
  return anthropic_message(id, model, whole, anthropic_stop_reason(r.finish_reason, !r.stop_string.empty(), reply.n_calls()),
                           r.stop_string, {r.prompt_tokens, r.completion_tokens});
}

json anthropic_error_body(const ApiError& e) {
  std::string type = "api_error";
  switch (e.status()) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: break;
  }
  return json{{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

namespace {
std::string event(const char* name, const json& data) {
  return std::string("event: ") + name + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}
}  // namespace

std::string AnthropicEvents::start(const std::string& id, const std::string& model, int input_tokens) {
  json msg{{"id", id},          {"type", "message"},        {"role", "assistant"},
           {"model", model},    {"content", json::array()}, {"stop_reason", nullptr},
           {"stop_sequence", nullptr}, {"usage", {{"input_tokens", input_tokens}, {"output_tokens", 0}}}};
  return event("message_start", json{{"type", "message_start"}, {"message", msg}});
}

std::string AnthropicEvents::open(Block b, const json& content_block) {
  std::string out = close();
  open_ = b;
  ++index_;
  return out + event("content_block_start",
                     json{{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
}

std::string AnthropicEvents::close() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  return event("content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicEvents::delta(const ReplyDelta& d) {
  std::string out;
  auto block_delta = [&](const json& delta) {
    out += event("content_block_delta", json{{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
  };
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking) out += open(Block::kThinking, json{{"type", "thinking"}, {"thinking", ""}});
    block_delta(json{{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) out += open(Block::kText, json{{"type", "text"}, {"text", ""}});
    block_delta(json{{"type", "text_delta"}, {"text", d.content}});
  }
  for (const ToolCall& c : d.calls) {
    out += open(Block::kNone, json{{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}});
    block_delta(json{{"type", "input_json_delta"}, {"partial_json", c.arguments}});
    out += event("content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}});
  }
  return out;
}

std::string AnthropicEvents::finish(const std::string& stop_reason, const std::string& stop_sequence,
                                    const AnthropicUsage& usage) {
  std::string out = close();
  out += event("message_delta",
               json{{"type", "message_delta"},
                    {"delta", {{"stop_reason", stop_reason},
                               {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
                    {"usage", {{"input_tokens", usage.input_tokens}, {"output_tokens", usage.output_tokens}}}});
  return out + event("message_stop", json{{"type", "message_stop"}});
}

std::string AnthropicEvents::next(const std::string& id, const std::string& model, int input_tokens,
                                  ReplyParser& reply, const std::string& text, bool done, const Job& job) {
  std::string out;
  if (!started_) out += start(id, model, input_tokens);
  started_ = true;
  ReplyDelta d = reply.feed(text);
  if (done) d.append(reply.finish());
  out += delta(d);
  if (!done) return out;
  if (auto err = job.error()) return out + error(*err);
  const JobResult r = *job.result();
  return out + finish(anthropic_stop_reason(r.finish_reason, !r.stop_string.empty(), reply.n_calls()), r.stop_string,
                      {r.prompt_tokens, r.completion_tokens});
}

std::string AnthropicEvents::ping() { return event("ping", json{{"type", "ping"}}); }

std::string AnthropicEvents::error(const ApiError& e) { return event("error", anthropic_error_body(e)); }

}  // namespace moestream
