// Implementation of runtime/server/completion_request.h.
#include "runtime/server/completion_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace moestream {

namespace {
using OJ = nlohmann::ordered_json;
using enum FieldEndpoint;
using enum FieldUse;

// OpenAI's fields of both endpoints, then the extensions (llama.cpp's and vLLM's names).
constexpr RequestField kRequestFields[] = {
    {"model", kBoth, kHonoured, ""},
    {"prompt", kCompletions, kHonoured, ""},
    {"messages", kChat, kHonoured, ""},
    {"max_tokens", kBoth, kHonoured, ""},
    {"max_completion_tokens", kBoth, kHonoured, ""},
    {"temperature", kBoth, kHonoured, ""},
    {"top_p", kBoth, kHonoured, ""},
    {"seed", kBoth, kHonoured, ""},
    {"stop", kBoth, kHonoured, ""},
    {"stream", kBoth, kHonoured, ""},
    {"stream_options", kBoth, kHonoured, ""},
    {"n", kBoth, kHonoured, ""},
    {"presence_penalty", kBoth, kHonoured, ""},
    {"frequency_penalty", kBoth, kHonoured, ""},
    {"logit_bias", kBoth, kHonoured, ""},
    {"logprobs", kBoth, kHonoured, ""},
    {"top_logprobs", kChat, kHonoured, ""},
    {"tools", kChat, kHonoured, "rendered by the template; the reply's calls parsed into tool_calls"},
    {"tool_choice", kChat, kHonoured, "\"auto\", \"none\" (tools not offered), \"required\" or a named function (enforced)"},
    {"parallel_tool_calls", kChat, kDefaultOnly, "true"},
    {"user", kBoth, kHonoured, "a label: checked to be a string, no effect on the output"},
    {"echo", kCompletions, kDefaultOnly, "false"},
    {"best_of", kCompletions, kDefaultOnly, "equal to n"},
    {"suffix", kCompletions, kDefaultOnly, "\"\""},
    {"response_format", kBoth, kHonoured, "text, json_object, json_schema (strict or not): enforced token by token"},
    {"store", kChat, kDefaultOnly, "false"},
    {"functions", kChat, kRefused, ""},
    {"function_call", kChat, kRefused, ""},
    {"metadata", kChat, kRefused, ""},
    {"modalities", kChat, kRefused, ""},
    {"audio", kChat, kRefused, ""},
    {"prediction", kChat, kRefused, ""},
    {"reasoning_effort", kChat, kRefused, ""},
    {"service_tier", kBoth, kRefused, ""},
    {"web_search_options", kChat, kRefused, ""},
    {"top_k", kBoth, kHonoured, ""},
    {"min_p", kBoth, kHonoured, ""},
    {"typical_p", kBoth, kHonoured, ""},
    {"repeat_penalty", kBoth, kHonoured, ""},
    {"repetition_penalty", kBoth, kHonoured, ""},
    {"repeat_last_n", kBoth, kHonoured, ""},
    {"ignore_eos", kBoth, kHonoured, ""},
    {"replay_request", kBoth, kHonoured, ""},
    {"chat_template_kwargs", kChat, kHonoured, ""},
    {"grammar", kBoth, kHonoured, "xgrammar EBNF (GBNF-like), enforced token by token"},
    {"forced_output", kBoth, kHonoured, "test only: refused unless the server runs with `test_forced_output`"},
};

double number(const OJ& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad_param(name, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_param(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return d;
}

int64_t integer(const OJ& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad_param(name, "must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) bad_param(name, "is out of range");
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi)
    bad_param(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(i));
  return i;
}

bool boolean(const OJ& v, const std::string& name) {
  if (!v.is_boolean()) bad_param(name, "must be true or false");
  return v.get<bool>();
}

// OpenAI content: a string, null, or a list of parts of which only {"type":"text"} are supported.
std::string content_text(const OJ& c, const std::string& name) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_param(name, "must be a string or a list of content parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string pn = name + "[" + std::to_string(i) + "]";
    if (!c[i].is_object() || c[i].value("type", "") != "text" || !c[i].contains("text") || !c[i]["text"].is_string())
      bad_param(pn, "only {\"type\": \"text\", \"text\": string} parts are supported");
    out += c[i]["text"].get<std::string>();
  }
  return out;
}

// An assistant message's tool_calls as the client sends them back (arguments a JSON string),
// with the arguments parsed into an object: templates iterate over or re-serialize them.
OJ parse_tool_calls(const OJ& calls, const std::string& name) {
  if (!calls.is_array()) bad_param(name, "must be a list");
  OJ out = OJ::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string cn = name + "[" + std::to_string(i) + "]";
    const OJ& c = calls[i];
    if (!c.is_object()) bad_param(cn, "must be an object");
    if (c.value("type", OJ("function")) != "function") bad_param(cn + ".type", "must be \"function\"");
    if (c.contains("id") && !c["id"].is_string()) bad_param(cn + ".id", "must be a string");
    if (!c.contains("function") || !c["function"].is_object()) bad_param(cn + ".function", "must be an object");
    const OJ& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) bad_param(cn + ".function.name", "must be a string");
    OJ args = OJ::object();
    if (f.contains("arguments") && !f["arguments"].is_null()) {
      if (!f["arguments"].is_string()) bad_param(cn + ".function.arguments", "must be a string of JSON");
      args = OJ::parse(f["arguments"].get<std::string>(), nullptr, false);
      if (!args.is_object()) bad_param(cn + ".function.arguments", "must be a JSON object");
    }
    OJ call = c;
    call["type"] = "function";
    call["function"]["arguments"] = std::move(args);
    out.push_back(std::move(call));
  }
  return out;
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
void check_tools(const OJ& tools) {
  if (!tools.is_array()) bad_param("tools", "must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string tn = "tools[" + std::to_string(i) + "]";
    const OJ& t = tools[i];
    if (!t.is_object() || t.value("type", OJ("")) != "function") bad_param(tn + ".type", "must be \"function\"");
    if (!t.contains("function") || !t["function"].is_object()) bad_param(tn + ".function", "must be an object");
    const OJ& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      bad_param(tn + ".function.name", "must be a non-empty string");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      bad_param(tn + ".function.parameters", "must be a JSON schema object");
  }
}

OJ parse_messages(const OJ& m) {
  if (!m.is_array() || m.empty()) bad_param("messages", "must be a non-empty list");
  OJ out = OJ::array();
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) bad_param(name, "must be an object");
    OJ msg = m[i];
    if (!msg.contains("role") || !msg["role"].is_string()) bad_param(name + ".role", "must be a string");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad_param(name + ".role", "must be system, user, assistant, tool or developer, got '" + role + "'");
    if (!msg.contains("content") && role != "assistant") bad_param(name + ".content", "is required");
    msg["content"] = content_text(msg.value("content", OJ(nullptr)), name + ".content");
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      if (role != "assistant") bad_param(name + ".tool_calls", "only an assistant message has tool_calls");
      msg["tool_calls"] = parse_tool_calls(msg["tool_calls"], name + ".tool_calls");
    }
    if (msg.contains("tool_call_id") && !msg["tool_call_id"].is_null() && !msg["tool_call_id"].is_string())
      bad_param(name + ".tool_call_id", "must be a string");
    out.push_back(std::move(msg));
  }
  return out;
}
// Every non-null field must be known for this endpoint and not refused.
void check_fields(const OJ& j, bool chat) {
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // a plain reference: clang 14 cannot capture a structured binding
    if (item.value().is_null()) continue;
    const auto f = std::find_if(std::begin(kRequestFields), std::end(kRequestFields),
                                [&](const RequestField& r) { return r.name == key; });
    if (f == std::end(kRequestFields) || f->endpoint == (chat ? kCompletions : kChat))
      bad_param(key, std::string("unknown field for ") + (chat ? "/v1/chat/completions" : "/v1/completions") +
                   " (docs/server.md lists the fields this server takes)");
    if (f->use == kRefused) bad_param(key, "is not supported by this server");
  }
}

// A kDefaultOnly field: accepted only when `ok` (its no-op value).
void default_only(const OJ& j, const char* key, bool (*ok)(const OJ&, const CompletionRequest&),
                  const CompletionRequest& r) {
  if (!j.contains(key) || j[key].is_null() || ok(j[key], r)) return;
  const auto f = std::find_if(std::begin(kRequestFields), std::end(kRequestFields),
                              [&](const RequestField& x) { return x.name == key; });
  bad_param(key, "only " + std::string(f->note) + " is supported, got " + j[key].dump());
}

// response_format: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
// {"name", "schema", "strict", "description"}}; text is no constraint.
std::optional<ConstraintSpec> parse_response_format(const OJ& f) {
  if (!f.is_object()) bad_param("response_format", "must be an object with a \"type\"");
  if (!f.contains("type") || !f["type"].is_string()) bad_param("response_format.type", "must be a string");
  const std::string type = f["type"].get<std::string>();
  const auto only = [&](std::initializer_list<std::string_view> keys) {
    for (const auto& item : f.items()) {
      const std::string& key = item.key();
      if (std::find(keys.begin(), keys.end(), key) == keys.end() && !item.value().is_null())
        bad_param("response_format." + key, "unknown field for type \"" + type + "\"");
    }
  };
  if (type == "text") {
    only({"type"});
    return std::nullopt;
  }
  if (type == "json_object") {
    only({"type"});
    return ConstraintSpec{ConstraintSpec::Kind::kJsonObject, "", false};
  }
  if (type != "json_schema")
    bad_param("response_format.type", "must be text, json_object or json_schema, got \"" + type + "\"");
  only({"type", "json_schema"});
  if (!f.contains("json_schema") || !f["json_schema"].is_object())
    bad_param("response_format.json_schema", "must be an object with a \"schema\"");
  const OJ& js = f["json_schema"];
  for (const auto& item : js.items()) {
    const std::string& key = item.key();
    if (key != "name" && key != "schema" && key != "strict" && key != "description" && !item.value().is_null())
      bad_param("response_format.json_schema." + key, "unknown field (name, schema, strict, description)");
  }
  if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string())
    bad_param("response_format.json_schema.name", "must be a string");
  if (!js.contains("schema") || !(js["schema"].is_object() || js["schema"].is_boolean()))
    bad_param("response_format.json_schema.schema", "is required: a JSON Schema object");
  ConstraintSpec spec{ConstraintSpec::Kind::kJsonSchema, js["schema"].dump(), false};
  if (js.contains("strict") && !js["strict"].is_null())
    spec.strict = boolean(js["strict"], "response_format.json_schema.strict");
  return spec;
}

std::vector<LogitBias> parse_logit_bias(const OJ& b) {
  if (!b.is_object()) bad_param("logit_bias", "must be an object of token id (a string) to bias");
  if (b.size() > 1024) bad_param("logit_bias", "at most 1024 entries");
  std::vector<LogitBias> out;
  for (const auto& [key, value] : b.items()) {
    const std::string name = "logit_bias." + key;
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    // The id's own spelling only: "5", "05" and "+5" would otherwise be three entries for one token.
    if (used == 0 || used != key.size() || id < 0 || id > INT32_MAX || key != std::to_string(id))
      bad_param(name, "keys must be token ids in decimal, without sign or leading zeros");
    out.push_back({int(id), float(number(value, name, -100, 100))});
  }
  return out;
}
}  // namespace

std::span<const RequestField> request_fields() { return kRequestFields; }

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
  check_fields(j, chat);
  CompletionRequest r;
  r.chat = chat;
  if (j.contains("model")) {
    if (!j["model"].is_string()) bad_param("model", "must be a string");
    const std::string m = j["model"].get<std::string>();
    if (m != limits.model_id)
      throw ApiError(404, "model_not_found", "model '" + m + "' does not exist; this server serves '" +
                                                 limits.model_id + "'", "model");
  }
  if (chat) {
    if (!j.contains("messages")) bad_param("messages", "is required");
    r.messages = parse_messages(j["messages"]);
    if (j.contains("tools") && !j["tools"].is_null()) {
      check_tools(j["tools"]);
      r.tools = j["tools"];
    }
    if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
      const OJ& tc = j["tool_choice"];
      if (tc.is_object()) {  // {"type": "function", "function": {"name": N}}: one call of N, enforced
        if (tc.value("type", "") != "function" || !tc.contains("function") || !tc["function"].is_object() ||
            !tc["function"].contains("name") || !tc["function"]["name"].is_string())
          bad_param("tool_choice", "a named function is {\"type\": \"function\", \"function\": {\"name\": ...}}, got " + tc.dump());
        r.forced_tool = tc["function"]["name"].get<std::string>();
      } else if (tc == "required") {  // one or more calls, enforced
        r.forced_tool = "";
      } else if (tc == "none") {
        r.tools = nullptr;  // not offered: the template shows none, the reply is not parsed
      } else if (tc != "auto") {
        bad_param("tool_choice", "must be \"auto\", \"none\", \"required\" or a function");
      }
      if (r.forced_tool && (r.tools.is_null() || r.tools.empty())) bad_param("tool_choice", "needs tools");
    }
    r.parse_tool_calls = !r.tools.is_null() && !r.tools.empty();
    if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
      if (!j["chat_template_kwargs"].is_object()) bad_param("chat_template_kwargs", "must be an object");
      r.template_kwargs = j["chat_template_kwargs"];
    }
  } else {
    if (!j.contains("prompt")) bad_param("prompt", "is required");
    const OJ& p = j["prompt"];
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (size_t i = 0; i < p.size(); ++i)
        r.prompt_ids.push_back(int(integer(p[i], "prompt[" + std::to_string(i) + "]", 0, INT32_MAX)));
    } else {
      bad_param("prompt", "must be a string, a list of one string, or a list of token ids");
    }
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (j.contains(key) && !j[key].is_null())
      r.max_tokens = int(integer(j[key], key, 1, limits.max_context));
  if (j.contains("temperature") && !j["temperature"].is_null())
    r.temperature = float(number(j["temperature"], "temperature", 0, 2));
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.top_p = float(number(j["top_p"], "top_p", 0, 1));
    if (r.top_p <= 0) bad_param("top_p", "must be > 0");
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) r.top_k = int(integer(j["top_k"], "top_k", 0, 1 << 20));
  if (j.contains("seed") && !j["seed"].is_null()) r.seed = uint64_t(integer(j["seed"], "seed", INT64_MIN, INT64_MAX));
  const auto given = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (given("n")) r.n = int(integer(j["n"], "n", 1, 128));
  if (given("min_p")) r.min_p = float(number(j["min_p"], "min_p", 0, 1));
  if (given("typical_p")) {
    r.typical_p = float(number(j["typical_p"], "typical_p", 0, 1));
    if (r.typical_p <= 0) bad_param("typical_p", "must be > 0");
  }
  if (given("repeat_penalty") && given("repetition_penalty"))
    bad_param("repetition_penalty", "give repeat_penalty or repetition_penalty, not both");
  for (const char* key : {"repeat_penalty", "repetition_penalty"})
    if (given(key)) {
      r.repeat_penalty = float(number(j[key], key, 0, 10));
      if (r.repeat_penalty <= 0) bad_param(key, "must be > 0");
    }
  if (given("repeat_last_n")) r.repeat_last_n = int(integer(j["repeat_last_n"], "repeat_last_n", -1, 1 << 24));
  if (given("presence_penalty")) r.presence_penalty = float(number(j["presence_penalty"], "presence_penalty", -2, 2));
  if (given("frequency_penalty")) r.frequency_penalty = float(number(j["frequency_penalty"], "frequency_penalty", -2, 2));
  if (given("logit_bias")) r.logit_bias = parse_logit_bias(j["logit_bias"]);
  if (given("logprobs")) {
    if (chat) {
      r.logprobs = boolean(j["logprobs"], "logprobs");
    } else if (!(j["logprobs"].is_boolean() && !j["logprobs"].get<bool>())) {
      // The legacy API: the number of most likely tokens to list (false: none asked, as before).
      r.top_logprobs = int(integer(j["logprobs"], "logprobs", 0, 20));
      r.logprobs = true;
    }
  }
  if (given("top_logprobs")) {
    r.top_logprobs = int(integer(j["top_logprobs"], "top_logprobs", 0, 20));
    if (!r.logprobs) bad_param("top_logprobs", "needs logprobs: true");
  }
  if (given("user") && !j["user"].is_string()) bad_param("user", "must be a string");
  if (j.contains("stream") && !j["stream"].is_null()) r.stream = boolean(j["stream"], "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const OJ& so = j["stream_options"];
    if (!so.is_object()) bad_param("stream_options", "must be an object");
    for (const auto& [key, value] : so.items())
      if (key != "include_usage" && !value.is_null()) bad_param("stream_options." + key, "unknown field (only include_usage)");
    if (so.contains("include_usage")) r.include_usage = boolean(so["include_usage"], "stream_options.include_usage");
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) r.ignore_eos = boolean(j["ignore_eos"], "ignore_eos");
  if (j.contains("replay_request") && !j["replay_request"].is_null())
    r.replay_request = integer(j["replay_request"], "replay_request", 0, INT64_MAX);
  if (given("forced_output")) {
    if (!j["forced_output"].is_string()) bad_param("forced_output", "must be a string");
    r.forced_output = j["forced_output"].get<std::string>();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const OJ& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (size_t i = 0; i < s.size(); ++i) {
        if (!s[i].is_string()) bad_param("stop[" + std::to_string(i) + "]", "must be a string");
        r.stop.push_back(s[i].get<std::string>());
      }
    } else {
      bad_param("stop", "must be a string or a list of at most 4 strings");
    }
    for (const auto& s1 : r.stop)
      if (s1.empty()) bad_param("stop", "stop strings must not be empty");
  }
  default_only(j, "echo", [](const OJ& v, const CompletionRequest&) { return v == false; }, r);
  default_only(j, "best_of", [](const OJ& v, const CompletionRequest& r) { return v == r.n; }, r);
  default_only(j, "suffix", [](const OJ& v, const CompletionRequest&) { return v == ""; }, r);
  if (given("response_format")) {
    r.constraint = parse_response_format(j["response_format"]);
    r.constraint_field = "response_format";
  }
  if (given("grammar")) {
    if (!j["grammar"].is_string() || j["grammar"].get<std::string>().empty())
      bad_param("grammar", "must be a non-empty string (xgrammar EBNF, docs/server.md)");
    if (r.constraint) bad_param("grammar", "give response_format (json_object/json_schema) or grammar, not both");
    r.constraint = ConstraintSpec{ConstraintSpec::Kind::kGrammar, j["grammar"].get<std::string>(), true};
    r.constraint_field = "grammar";
  }
  if (r.forced_tool && r.constraint)
    bad_param("tool_choice", "cannot be combined with " + r.constraint_field + " (both constrain the reply)");
  if (r.forced_tool && r.ignore_eos) bad_param("ignore_eos", "cannot be combined with tool_choice");
  if (r.constraint && r.ignore_eos)
    bad_param("ignore_eos", "cannot be combined with " + r.constraint_field + ": a constrained output ends at the model's end token");
  default_only(j, "parallel_tool_calls", [](const OJ& v, const CompletionRequest&) { return v == true; }, r);
  default_only(j, "store", [](const OJ& v, const CompletionRequest&) { return v == false; }, r);
  return r;
}

}  // namespace moestream
