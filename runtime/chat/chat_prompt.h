// Turns OpenAI chat messages into prompt text with the model's chat template from
// tokenizer_config.json, passing the special tokens the way transformers' apply_chat_template does.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/reply_parser.h"

namespace moestream {

class ChatPrompt {
 public:
  // Reads chat_template (a string, or a list of {name, template}: "default" is used) and
  // bos/eos/unk/pad tokens from tokenizer_config.json. Throws IoError/FormatError naming the file
  // and field; ChatTemplateError for a template we cannot parse. A config without a template
  // gives a ChatPrompt whose has_template() is false.
  static ChatPrompt load(const std::filesystem::path& tokenizer_config);
  explicit ChatPrompt(const std::string& template_source, nlohmann::ordered_json special_tokens = {});

  bool has_template() const { return tpl_.has_value(); }
  // The family of the markup the template writes (tool calls, thinking): detect_reply_format.
  ReplyFormat reply_format() const { return reply_format_; }
  // Renders messages (and optional tools); `extra` adds template variables (enable_thinking, ...)
  // without overriding messages/tools/add_generation_prompt. Messages are prepared as transformers'
  // apply_chat_template prepares them (null-valued keys dropped; reasoning_content, thinking or
  // reasoning aliased to both thinking and reasoning_content; a tool call's arguments as the
  // template reads them: JSON text for DeepSeek-V3.1's, else as given); `documents` is none unless given.
  // Throws ChatTemplateError.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools = nullptr,
                     const nlohmann::ordered_json& extra = nullptr) const;

 private:
  ChatPrompt() = default;
  std::optional<ChatTemplate> tpl_;
  ReplyFormat reply_format_ = ReplyFormat::kPlain;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace moestream
