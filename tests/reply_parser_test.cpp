// runtime/chat/reply_parser: each family's replies split into reasoning, content and tool calls,
// whole and streamed in two pieces at every byte boundary and byte by byte (the pieces must add up
// to the whole reply's parse, so no markup ever shows as content).
#include "runtime/chat/reply_parser.h"

#include "runtime/chat/chat_prompt.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace moestream {
namespace {

using OJ = nlohmann::ordered_json;

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

ReplyParserOptions tools_on(bool reasoning_first = false) {
  ReplyParserOptions o;
  o.parse_tool_calls = true;
  o.starts_in_reasoning = reasoning_first;
  o.tools = OJ::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"zip":{"type":"string"}}}}}])");
  return o;
}

Parsed run(ReplyFormat f, const ReplyParserOptions& o, const std::vector<std::string>& pieces) {
  ReplyParser p(f, o);
  ReplyDelta all;
  for (const auto& s : pieces) all.append(p.feed(s));
  all.append(p.finish());
  return {all.reasoning, all.content, all.calls};
}

void expect_same(const Parsed& a, const Parsed& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// The whole reply parsed at once must equal `want`, and so must every split of it.
void check(ReplyFormat f, const ReplyParserOptions& o, const std::string& text, const Parsed& want) {
  expect_same(run(f, o, {text}), want, "whole");
  for (size_t i = 0; i <= text.size(); ++i)
    expect_same(run(f, o, {text.substr(0, i), text.substr(i)}), want, "split at byte " + std::to_string(i));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(run(f, o, bytes), want, "byte by byte");
}

TEST(ReplyParser, DetectsEachFamilyFromItsTemplate) {
  EXPECT_EQ(detect_reply_format("{{'<tool_call>\\n'}}{{ tool_call.arguments | tojson }}"), ReplyFormat::kHermes);
  EXPECT_EQ(detect_reply_format("<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>"), ReplyFormat::kGlm45);
  EXPECT_EQ(detect_reply_format("<|start|>assistant<|channel|>final<|message|>"), ReplyFormat::kHarmony);
  EXPECT_EQ(detect_reply_format("<|tool_calls_section_begin|>"), ReplyFormat::kKimiK2);
  EXPECT_EQ(detect_reply_format("<｜tool▁calls▁begin｜>"), ReplyFormat::kDeepSeekV31);
  EXPECT_EQ(detect_reply_format("<|im_start|>{{ m.content }}<|im_end|>"), ReplyFormat::kPlain);
  EXPECT_EQ(detect_reply_format("<tool_call>\n<function={{ name }}>"), ReplyFormat::kPlain);  // Qwen3-Coder
  for (auto f : {ReplyFormat::kPlain, ReplyFormat::kHermes, ReplyFormat::kGlm45, ReplyFormat::kHarmony,
                 ReplyFormat::kKimiK2, ReplyFormat::kDeepSeekV31})
    EXPECT_EQ(reply_format_named(reply_format_name(f)), f);
  EXPECT_FALSE(reply_format_named("chatml"));
}

TEST(ReplyParser, PromptThatEndsInThinkOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

TEST(ReplyParser, HermesThinkingContentAndTwoCalls) {
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>";
  check(ReplyFormat::kHermes, tools_on(), text,
        {"The user wants weather.", "Let me check.",
         {{"call_0", "get_weather", R"({"city":"Paris","days":2})"}, {"call_1", "get_weather", R"({"city":"Oslo"})"}}});
}

TEST(ReplyParser, HermesWithoutToolsKeepsTheMarkupAsContent) {
  ReplyParserOptions o;  // tools not offered (or tool_choice none)
  check(ReplyFormat::kHermes, o, "Say <tool_call>{\"name\": \"x\"}</tool_call> ok",
        {"", "Say <tool_call>{\"name\": \"x\"}</tool_call> ok", {}});
}

TEST(ReplyParser, HermesMalformedCallIsContentAndCutOffCallIsParsedIfWhole) {
  check(ReplyFormat::kHermes, tools_on(), "A <tool_call>{not json}</tool_call>",
        {"", "A <tool_call>{not json}</tool_call>", {}});
  check(ReplyFormat::kHermes, tools_on(), "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}",
        {"", "", {{"call_0", "get_weather", "{}"}}});
  check(ReplyFormat::kHermes, tools_on(), "<tool_call>{\"name\": \"get_wea", {"", "<tool_call>{\"name\": \"get_wea", {}});
}

TEST(ReplyParser, ReasoningFromThePromptsOpenThink) {
  check(ReplyFormat::kHermes, tools_on(/*reasoning_first=*/true), "hmm, 2+2\n</think>\n\n4",
        {"hmm, 2+2", "4", {}});
  // A <think> after content is content.
  check(ReplyFormat::kHermes, tools_on(), "x <think>y</think>", {"", "x <think>y</think>", {}});
}

TEST(ReplyParser, Glm45TypesArgumentsByTheToolSchema) {
  const std::string text =
      "\n<think>Need weather.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
      "<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
      "<arg_key>zip</arg_key>\n<arg_value>100000</arg_value>\n<arg_key>tags</arg_key>\n"
      "<arg_value>[\"a\"]</arg_value>\n</tool_call>";
  check(ReplyFormat::kGlm45, tools_on(), text,
        {"Need weather.", "Checking.",
         {{"call_0", "get_weather", R"({"city":"Beijing","days":3,"zip":"100000","tags":["a"]})"}}});
  check(ReplyFormat::kGlm45, tools_on(), "<tool_call>now</tool_call>", {"", "", {{"call_0", "now", "{}"}}});
}

TEST(ReplyParser, HarmonyChannelsAndACall) {
  const std::string text =
      "<|channel|>analysis<|message|>Need to call the tool.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
  check(ReplyFormat::kHarmony, tools_on(), text,
        {"Need to call the tool.", "", {{"call_0", "get_weather", R"({"city":"Paris"})"}}});
  // The recipient may stand before the channel, and final is content.
  check(ReplyFormat::kHarmony, tools_on(),
        "<|channel|>analysis<|message|>ok<|end|><|start|>assistant to=functions.now<|channel|>commentary json"
        "<|message|>{}<|call|>",
        {"ok", "", {{"call_0", "now", "{}"}}});
  check(ReplyFormat::kHarmony, tools_on(),
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 C.",
        {"Simple.", "It is 21 C.", {}});
  check(ReplyFormat::kHarmony, tools_on(), "No headers at all.", {"", "No headers at all.", {}});
}

TEST(ReplyParser, KimiK2KeepsTheModelsCallIds) {
  const std::string text =
      "I'll look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.now:1"
      "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
  check(ReplyFormat::kKimiK2, tools_on(), text,
        {"", "I'll look.",
         {{"functions.get_weather:0", "get_weather", R"({"city":"Paris"})"}, {"functions.now:1", "now", "{}"}}});
}

TEST(ReplyParser, DeepSeekV31CallsAfterReasoning) {
  const std::string text =
      "Think about it.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  check(ReplyFormat::kDeepSeekV31, tools_on(/*reasoning_first=*/true), text,
        {"Think about it.", "Sure.", {{"call_0", "get_weather", R"({"city":"Paris"})"}}});
}

TEST(ReplyParser, StreamedPiecesNeverHoldTextThatCannotStartMarkup) {
  ReplyParser p(ReplyFormat::kHermes, tools_on());
  EXPECT_EQ(p.feed("Hello wor").content, "Hello wor");
  EXPECT_EQ(p.feed("ld <tool").content, "ld");  // " <tool" may open a call; the space waits too
  EXPECT_EQ(p.feed("box>").content, " <toolbox>");
  EXPECT_EQ(p.finish().content, "");
}

TEST(ReplyParser, PlainIsTextAsGenerated) {
  check(ReplyFormat::kPlain, tools_on(), "  <think>x</think> <tool_call>{}</tool_call> ",
        {"", "  <think>x</think> <tool_call>{}</tool_call> ", {}});
}

}  // namespace
}  // namespace moestream

namespace moestream {
namespace {

// What Qwen3's own template (shared/tokenizers/qwen3) writes for an assistant turn with reasoning,
// text and two calls is read back by the parser as those calls: the format is the template's.
TEST(ReplyParser, ReadsBackWhatTheRealQwen3TemplateWrites) {
  const std::string config = std::string(MOESTREAM_SOURCE_DIR) + "/../shared/tokenizers/qwen3/tokenizer_config.json";
  if (!std::ifstream(config)) GTEST_SKIP() << config << " is not here (shared/ holds the real Qwen3 config)";
  const ChatPrompt chat = ChatPrompt::load(config);
  ASSERT_EQ(chat.reply_format(), ReplyFormat::kHermes);
  const OJ messages = OJ::parse(R"([{"role": "user", "content": "Weather in Paris and Oslo?"},
      {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities, two calls.",
       "tool_calls": [{"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                      {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}]}])");
  const std::string text = chat.render(messages, false, tools_on().tools);
  const std::string open = "<|im_start|>assistant\n";
  const size_t from = text.rfind(open) + open.size(), to = text.rfind("<|im_end|>");
  ASSERT_LT(from, to) << text;
  const std::string reply = text.substr(from, to - from);
  check(ReplyFormat::kHermes, tools_on(), reply,
        {"Two cities, two calls.", "Checking both.",
         {{"call_0", "get_weather", R"({"city":"Paris"})"}, {"call_1", "get_weather", R"({"city":"Oslo","days":2})"}}});
  // The generation prompt without thinking closes an empty <think>: the reply starts as content.
  const std::string prompt = chat.render(OJ::array({messages[0]}), true, nullptr, OJ{{"enable_thinking", false}});
  EXPECT_FALSE(prompt_opens_reasoning(prompt));
}

}  // namespace
}  // namespace moestream
