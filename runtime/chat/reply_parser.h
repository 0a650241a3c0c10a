// A model's reply text split into reasoning, content and tool calls by the markup of its chat
// format family (Hermes/Qwen3, GLM-4.5, gpt-oss harmony, Kimi K2, DeepSeek-V3.1); incremental,
// so a stream never shows markup that may still turn out to start a tool call.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moestream {

// How a family writes thinking and tool calls (docs/server.md "Tool calls" shows each):
//  kHermes       <think>..</think>, <tool_call>{"name": N, "arguments": {..}}</tool_call> (Qwen3)
//  kGlm45        <think>..</think>, <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>..</tool_call>
//  kHarmony      <|channel|>analysis|commentary|final[ to=functions.N]..<|message|>..<|end|> (gpt-oss)
//  kKimiK2       <think>..</think>, <|tool_calls_section_begin|><|tool_call_begin|>functions.N:I
//                <|tool_call_argument_begin|>{..}<|tool_call_end|>..<|tool_calls_section_end|>
//  kDeepSeekV31  <think>..</think>, <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{..}
//                <｜tool▁call▁end｜>..<｜tool▁calls▁end｜>
//  kPlain        no markup: all text is content
enum class ReplyFormat : uint8_t { kPlain, kHermes, kGlm45, kHarmony, kKimiK2, kDeepSeekV31 };

// The family whose markup a chat template writes; kPlain when it writes none we know.
ReplyFormat detect_reply_format(std::string_view template_source);
// "plain", "hermes", "glm45", "harmony", "kimi_k2", "deepseek_v31"; nullopt for another name.
std::optional<ReplyFormat> reply_format_named(std::string_view name);
std::string_view reply_format_name(ReplyFormat f);

// True when a rendered generation prompt leaves the model inside an opened <think> (Qwen3
// thinking models, DeepSeek-V3.1 with thinking): its reply starts with reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

struct ToolCall {
  std::string id;         // Kimi K2's own (functions.N:I); else id_prefix + the call's number
  std::string name;
  std::string arguments;  // the arguments object as JSON text
};

struct ReplyDelta {
  std::string reasoning;  // new reasoning text
  std::string content;    // new content text
  std::vector<ToolCall> calls;  // tool calls completed by this text, whole
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  void append(ReplyDelta d);
};

struct ReplyParserOptions {
  bool parse_tool_calls = false;     // tools were offered (tool_choice is not "none")
  bool starts_in_reasoning = false;  // prompt_opens_reasoning(prompt)
  nlohmann::ordered_json tools;      // the offered tools: GLM-4.5's argument values are typed by them
  std::string id_prefix = "call_";
};

class ReplyParser {
 public:
  ReplyParser(ReplyFormat format, ReplyParserOptions opts);
  ~ReplyParser();
  ReplyParser(ReplyParser&&) noexcept;
  ReplyParser& operator=(ReplyParser&&) noexcept;

  // Adds reply text (any split, even inside a UTF-8 character or a marker); returns what is
  // certain now. Text that may be the start of markup is held back until it is decided.
  ReplyDelta feed(std::string_view text);
  // The end of the reply: held-back text comes out; a call cut off by the end is parsed if it is
  // whole JSON, else its text is content.
  ReplyDelta finish();
  int n_calls() const;

  struct Machine;

 private:
  std::unique_ptr<Machine> m_;
};

}  // namespace moestream
