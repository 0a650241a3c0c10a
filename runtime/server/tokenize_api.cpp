// Implementation of runtime/server/tokenize_api.h.
#include "runtime/server/tokenize_api.h"

#include "runtime/server/api_error.h"
#include "runtime/server/completion_request.h"

namespace moestream {

namespace {
using json = nlohmann::json;
using OJ = nlohmann::ordered_json;

// The body as an object whose fields are all in `known` and whose model (if named) is ours.
OJ parse_body(const std::string& body, const TokenizeContext& ctx, std::initializer_list<const char*> known,
              const char* endpoint) {
  check_json_depth(body);
  OJ j = OJ::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw ApiError(400, "invalid_json", "request body must be a JSON object");
  for (const auto& item : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || item.key() == k;
    if (!ok) bad_param(item.key(), std::string("unknown field for ") + endpoint);
  }
  if (j.contains("model") && !j["model"].is_null() && j["model"] != ctx.model_id)
    throw ApiError(404, "model_not_found", "model " + j["model"].dump() + " does not exist; this server serves '" +
                                               ctx.model_id + "'", "model");
  if (!ctx.tok) throw ApiError(400, "no_tokenizer", "this model has no tokenizer");
  return j;
}

bool flag(const OJ& j, const char* key, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_boolean()) bad_param(key, "must be true or false");
  return j[key].get<bool>();
}
}  // namespace

json tokenize_reply(const std::string& body, const TokenizeContext& ctx) {
  const OJ j = parse_body(body, ctx, {"model", "prompt", "add_special_tokens", "messages", "tools",
                                      "chat_template_kwargs", "add_generation_prompt"}, "/tokenize");
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  if (has_prompt == has_messages) bad_param(has_prompt ? "messages" : "prompt", "give either prompt or messages");
  std::string text;
  bool add_special = false;
  if (has_prompt) {
    if (!j["prompt"].is_string()) bad_param("prompt", "must be a string");
    for (const char* k : {"tools", "chat_template_kwargs", "add_generation_prompt"})
      if (j.contains(k) && !j[k].is_null()) bad_param(k, "goes with messages, not prompt");
    text = j["prompt"].get<std::string>();
    add_special = flag(j, "add_special_tokens", true);  // as /v1/completions encodes a prompt
  } else {
    if (!ctx.chat || !ctx.chat->has_template())
      throw ApiError(400, "no_chat_template", "this model has no chat template", "messages");
    OJ chat = OJ::object();  // checked as /v1/chat/completions checks them
    for (const char* k : {"messages", "tools", "chat_template_kwargs"})
      if (j.contains(k)) chat[k] = j[k];
    const CompletionRequest r = parse_completion_request(chat.dump(), true, RequestLimits{ctx.model_id, ctx.max_context});
    try {
      text = ctx.chat->render(r.messages, flag(j, "add_generation_prompt", true), r.tools, r.template_kwargs);
    } catch (const ChatTemplateError& e) {
      throw ApiError(400, "chat_template_error", e.what(), "messages");
    }
    add_special = flag(j, "add_special_tokens", false);  // the template writes them
  }
  json ids = json::array();
  try {
    for (int32_t id : ctx.tok->encode(text, add_special)) ids.push_back(id);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_text", e.what(), has_prompt ? "prompt" : "messages");
  }
  const size_t n = ids.size();
  return json{{"tokens", std::move(ids)}, {"count", n}, {"max_model_len", ctx.max_context}};
}

json detokenize_reply(const std::string& body, const TokenizeContext& ctx) {
  const OJ j = parse_body(body, ctx, {"model", "tokens"}, "/detokenize");
  if (!j.contains("tokens") || !j["tokens"].is_array()) bad_param("tokens", "must be a list of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const OJ& v = j["tokens"][i];
    const std::string name = "tokens[" + std::to_string(i) + "]";
    if (!v.is_number_integer()) bad_param(name, "must be an integer");
    if (v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.vocab_size)
      bad_param(name, "token id " + v.dump() + " is outside the vocabulary of " + std::to_string(ctx.vocab_size));
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return json{{"prompt", ctx.tok->decode(ids, /*skip_special_tokens=*/false)}};
}

}  // namespace moestream
