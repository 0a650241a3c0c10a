// Chat templates of tokenizer_config.json rendered in C++: a Jinja subset (for/if/elif/else/set,
// namespace, macros, loop variables, the filters and string methods HF templates use, raise_exception,
// strftime_now).
#pragma once

#include <cstddef>
#include <cstdint>
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

// Limits that keep a hostile template or template input from overflowing the stack or exhausting
// memory or time; each is answered with a ChatTemplateError naming it. Real templates stay far
// below them (they nest fewer than 10 deep and render a few KB per message).
inline constexpr size_t kMaxTemplateBytes = size_t(1) << 20;           // template source
inline constexpr int kMaxTemplateBlockDepth = 64;        // nested if/for/set/macro/generation blocks
// Nested macro calls (recursion included): each level may nest blocks and expressions to their
// limits on the C stack, so this bounds the stack a render can use (real templates: < 10).
inline constexpr int kMaxTemplateMacroDepth = 50;
// Macro calls per render: a macro calling itself twice per level would otherwise make 2^50 calls
// within the depth limit.
inline constexpr int64_t kMaxTemplateMacroCalls = 1000000;
inline constexpr int kMaxTemplateExprDepth = 128;        // nested (), [], operators, filters, ...
inline constexpr int kMaxTemplateValueDepth = 128;       // nested lists/dicts of inputs and set values
inline constexpr size_t kMaxTemplateValueBytes = size_t(16) << 20;  // a string, list, dict or the output
inline constexpr size_t kMaxTemplateListItems = 1000000;            // items of one list
inline constexpr int64_t kMaxTemplateRangeItems = 100000;          // range()
inline constexpr int64_t kMaxTemplateLoopIterations = 1000000;     // for-loop iterations per render
inline constexpr int64_t kMaxTemplateTojsonIndent = 1024;          // tojson(indent=N)
inline constexpr size_t kMaxTemplateWorkBytes = size_t(4) << 30;   // copied + built per render

// Refuses a template input (messages, tools, a kwarg) that nests deeper than
// kMaxTemplateValueDepth, naming it; walks iteratively, so a hostile depth cannot overflow the
// stack here. Call it before copying a value parsed from untrusted JSON (copies recurse).
void check_template_input(const nlohmann::ordered_json& value, const std::string& name);

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
