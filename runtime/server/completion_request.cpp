// Implementation of runtime/server/completion_request.h.
#include "runtime/server/completion_request.h"

#include <cmath>

namespace moestream {

namespace {
using OJ = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, "invalid_request_error", param + ": " + msg, param);
}

double number(const OJ& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return d;
}

int64_t integer(const OJ& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(name, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) bad(name, "is out of range");
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi)
    bad(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(i));
  return i;
}

bool boolean(const OJ& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, "must be true or false");
  return v.get<bool>();
}

// OpenAI content: a string, null, or a list of parts of which only {"type":"text"} are supported.
std::string content_text(const OJ& c, const std::string& name) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(name, "must be a string or a list of content parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string pn = name + "[" + std::to_string(i) + "]";
    if (!c[i].is_object() || c[i].value("type", "") != "text" || !c[i].contains("text") || !c[i]["text"].is_string())
      bad(pn, "only {\"type\": \"text\", \"text\": string} parts are supported");
    out += c[i]["text"].get<std::string>();
  }
  return out;
}

OJ parse_messages(const OJ& m) {
  if (!m.is_array() || m.empty()) bad("messages", "must be a non-empty list");
  OJ out = OJ::array();
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) bad(name, "must be an object");
    OJ msg = m[i];
    if (!msg.contains("role") || !msg["role"].is_string()) bad(name + ".role", "must be a string");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad(name + ".role", "must be system, user, assistant, tool or developer, got '" + role + "'");
    if (!msg.contains("content") && role != "assistant") bad(name + ".content", "is required");
    msg["content"] = content_text(msg.value("content", OJ(nullptr)), name + ".content");
    out.push_back(std::move(msg));
  }
  return out;
}
}  // namespace

void check_json_depth(std::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw ApiError(400, "json_too_deep", "request JSON nests arrays/objects deeper than the limit of " +
                                                 std::to_string(max_depth) + " levels (at byte " +
                                                 std::to_string(i) + ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;  // unbalanced brackets are left to the parser to report
    }
  }
}

CompletionRequest parse_completion_request(const std::string& body, bool chat, const RequestLimits& limits) {
  check_json_depth(body);
  OJ j;
  try {
    j = OJ::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, "invalid_json", std::string("request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "invalid_json", "request body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (j.contains("model")) {
    if (!j["model"].is_string()) bad("model", "must be a string");
    const std::string m = j["model"].get<std::string>();
    if (m != limits.model_id)
      throw ApiError(404, "model_not_found", "model '" + m + "' does not exist; this server serves '" +
                                                 limits.model_id + "'", "model");
  }
  if (chat) {
    if (!j.contains("messages")) bad("messages", "is required");
    r.messages = parse_messages(j["messages"]);
    if (j.contains("tools") && !j["tools"].is_null()) {
      if (!j["tools"].is_array()) bad("tools", "must be a list");
      r.tools = j["tools"];
    }
    if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
      if (!j["chat_template_kwargs"].is_object()) bad("chat_template_kwargs", "must be an object");
      r.template_kwargs = j["chat_template_kwargs"];
    }
  } else {
    if (!j.contains("prompt")) bad("prompt", "is required");
    const OJ& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (size_t i = 0; i < p.size(); ++i)
        r.prompt_ids.push_back(int(integer(p[i], "prompt[" + std::to_string(i) + "]", 0, INT32_MAX)));
    } else {
      bad("prompt", "must be a string, a list of one string, or a list of token ids");
    }
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (j.contains(key) && !j[key].is_null())
      r.max_tokens = int(integer(j[key], key, 1, limits.max_context));
  if (j.contains("temperature") && !j["temperature"].is_null())
    r.temperature = float(number(j["temperature"], "temperature", 0, 2));
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.top_p = float(number(j["top_p"], "top_p", 0, 1));
    if (r.top_p <= 0) bad("top_p", "must be > 0");
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) r.top_k = int(integer(j["top_k"], "top_k", 0, 1 << 20));
  if (j.contains("seed") && !j["seed"].is_null()) r.seed = uint64_t(integer(j["seed"], "seed", INT64_MIN, INT64_MAX));
  if (j.contains("n") && !j["n"].is_null() && integer(j["n"], "n", 1, 128) != 1) bad("n", "only n = 1 is supported");
  if (j.contains("stream") && !j["stream"].is_null()) r.stream = boolean(j["stream"], "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const OJ& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "must be an object");
    if (so.contains("include_usage")) r.include_usage = boolean(so["include_usage"], "stream_options.include_usage");
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) r.ignore_eos = boolean(j["ignore_eos"], "ignore_eos");
  if (j.contains("replay_request") && !j["replay_request"].is_null())
    r.replay_request = integer(j["replay_request"], "replay_request", 0, INT64_MAX);
  if (j.contains("stop") && !j["stop"].is_null()) {
    const OJ& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) bad("stop[" + std::to_string(i) + "]", "must be a string");
        r.stop.push_back(s[i].get<std::string>());
      }
    } else {
      bad("stop", "must be a string or a list of at most 4 strings");
    }
    for (const auto& s1 : r.stop)
      if (s1.empty()) bad("stop", "stop strings must not be empty");
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false && j["logprobs"] != 0)
    bad("logprobs", "log probabilities are not supported");
  if (j.contains("echo") && !j["echo"].is_null() && boolean(j["echo"], "echo")) bad("echo", "echo is not supported");
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (j.contains(key) && !j[key].is_null() && number(j[key], key, -2, 2) != 0)
      bad(key, "penalties are not supported; leave it at 0");
  return r;
}

}  // namespace moestream
