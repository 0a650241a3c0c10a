// Implementation of runtime/chat/chat_prompt.h.
#include "runtime/chat/chat_prompt.h"

#include "common/error.h"
#include "common/file_util.h"

namespace moestream {

namespace {
using OJ = nlohmann::ordered_json;

// A special token in tokenizer_config.json is a string or an AddedToken object {"content": ...}.
std::optional<std::string> token_string(const OJ& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}
// What transformers' apply_chat_template does to each message before rendering: keys whose value
// is None are dropped (_normalize_chat_messages), and reasoning given as reasoning_content,
// thinking or reasoning is exposed under both `thinking` (first) and `reasoning_content`
// (_alias_reasoning_fields), the names templates read. With `arguments_as_text`, tool calls'
// arguments objects become JSON text again (DeepSeek-V3.1's template concatenates them as strings;
// the others iterate over or re-serialize an object).
OJ normalize_messages(const OJ& messages, bool arguments_as_text) {
  if (!messages.is_array()) return messages;
  OJ out = OJ::array();
  for (const OJ& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    OJ kept = OJ::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) kept[it.key()] = it.value();
    if (arguments_as_text && kept.contains("tool_calls") && kept["tool_calls"].is_array())
      for (OJ& call : kept["tool_calls"])
        if (call.is_object() && call.contains("function") && call["function"].is_object() &&
            call["function"].contains("arguments") && !call["function"]["arguments"].is_string())
          call["function"]["arguments"] = call["function"]["arguments"].dump();
    const OJ* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && kept.contains(key)) reasoning = &kept[key];
    if (!reasoning) {
      out.push_back(std::move(kept));
      continue;
    }
    OJ aliased = OJ::object();
    aliased["thinking"] = *reasoning;
    for (auto it = kept.begin(); it != kept.end(); ++it) aliased[it.key()] = it.value();
    aliased["reasoning_content"] = *reasoning;
    out.push_back(std::move(aliased));
  }
  return out;
}
}  // namespace

ChatPrompt::ChatPrompt(const std::string& template_source, OJ special_tokens)
    : tpl_(ChatTemplate(template_source)),
      reply_format_(detect_reply_format(template_source)),
      special_tokens_(special_tokens.is_object() ? std::move(special_tokens) : OJ::object()) {}

ChatPrompt ChatPrompt::load(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  OJ cfg;
  try {
    cfg = OJ::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path.string() + ": not valid JSON: " + e.what());
  }
  if (!cfg.is_object()) throw FormatError(path.string() + ": top level is not a JSON object");
  OJ special = OJ::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!cfg.contains(key) || cfg[key].is_null()) continue;
    auto s = token_string(cfg[key]);
    if (!s) throw FormatError(path.string() + ": field " + key + " is neither a string nor {\"content\": string}");
    special[key] = *s;
  }
  ChatPrompt p;
  p.special_tokens_ = special;
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null()) return p;
  const OJ& t = cfg["chat_template"];
  std::optional<std::string> source;
  if (t.is_string()) {
    source = t.get<std::string>();
  } else if (t.is_array()) {
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        source = e["template"].get<std::string>();
    if (!source) throw FormatError(path.string() + ": field chat_template is a list without a \"default\" entry");
  } else {
    throw FormatError(path.string() + ": field chat_template is neither a string nor a list");
  }
  try {
    p.tpl_.emplace(*source);
    p.reply_format_ = detect_reply_format(*source);
  } catch (const ChatTemplateError& e) {
    throw ChatTemplateError(path.string() + ": field chat_template: " + e.what());
  }
  return p;
}

std::string ChatPrompt::render(const OJ& messages, bool add_generation_prompt, const OJ& tools,
                               const OJ& extra) const {
  if (!tpl_) throw ChatTemplateError("the model's tokenizer_config.json has no chat_template");
  // Before any copy: copying JSON recurses, so a hostile depth must be refused first.
  check_template_input(messages, "messages");
  check_template_input(tools, "tools");
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) check_template_input(it.value(), it.key());
  OJ ctx = special_tokens_;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  if (!ctx.contains("documents")) ctx["documents"] = nullptr;  // transformers always passes it
  ctx["messages"] = normalize_messages(messages, reply_format_ == ReplyFormat::kDeepSeekV31);
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (!tools.is_null()) ctx["tools"] = tools;
  else ctx["tools"] = nullptr;
  return tpl_->render(ctx);
}

}  // namespace moestream
