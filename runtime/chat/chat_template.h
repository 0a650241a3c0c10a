// Chat templates of tokenizer_config.json rendered in C++: a Jinja subset (for/if/elif/else/set,
// namespace, loop variables, the filters and string methods HF templates use, raise_exception).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moestream {

// A template that fails to parse, uses an unsupported construct, or calls raise_exception();
// the message names the line.
class ChatTemplateError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  // Parses with the settings transformers uses (trim_blocks, lstrip_blocks, loop controls).
  // Throws ChatTemplateError naming the line of a syntax error or unsupported tag.
  explicit ChatTemplate(const std::string& source);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Renders with `context` as the template's variables (messages, add_generation_prompt,
  // bos_token, eos_token, tools, ...). Key order of objects is kept, as Python dicts keep it, so
  // tojson matches transformers. Throws ChatTemplateError on raise_exception() or a type error.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::unique_ptr<jinja::Template> tpl_;
};

}  // namespace moestream
