// The request fields of runtime/server/completion_request.h: every sampling field parsed into the
// request, every unknown or refused field a 400 naming it, and docs/server.md listing them all.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "runtime/server/completion_request.h"

using namespace moestream;

namespace {
const RequestLimits kLimits{"demo", 512};

// The field a 400 names ("" when the body is accepted; other statuses fail the test).
std::string refused_field(const std::string& body, bool chat) {
  try {
    parse_completion_request(body, chat, kLimits);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_NE(std::string(e.body().dump()).find(e.param()), std::string::npos);
    return e.param();
  }
  return "";
}
}  // namespace

TEST(CompletionRequest, UnknownAndRefusedFieldsAre400NamingThem) {
  EXPECT_EQ(refused_field(R"({"prompt": "x", "foo": 1})", false), "foo");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "messages": []})", false), "messages");  // the other endpoint's
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "prompt": "x"})", true), "prompt");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "functions": []})", true), "functions");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "top_logprobs": 2})", false), "top_logprobs");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "echo": true})", false), "echo");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "stream_options": {"include_usage": true, "x": 1}})", false),
            "stream_options.x");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "best_of": 2})", false), "best_of");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "suffix": "y"})", false), "suffix");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", true),
            "tool_choice");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "bogus"}})", true),
            "response_format.type");
  // Their no-op values, null (= absent) and what OpenAI clients send by default pass.
  EXPECT_EQ(refused_field(R"({"prompt": "x", "echo": false, "best_of": 2, "n": 2, "suffix": "", "user": "u",
                              "foo": null, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": null})", false), "");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto", "store": false,
                              "response_format": {"type": "text"}, "logprobs": false, "n": 1, "stream": false})", true), "");
  // Every kRefused field of the table is refused, on its endpoints.
  for (const RequestField& f : request_fields()) {
    if (f.use != FieldUse::kRefused) continue;
    const bool chat = f.endpoint != FieldEndpoint::kCompletions;
    const std::string body = std::string(chat ? R"({"messages": [{"role": "user", "content": "x"}], ")" : R"({"prompt": "x", ")") +
                             std::string(f.name) + R"(": 1})";
    EXPECT_EQ(refused_field(body, chat), f.name);
  }
}

// One token, one spelling: "05" or "+5" would add a second bias to token 5 past the range check.
// The legacy endpoint's logprobs: false asks for none, as before logprobs existed here.
TEST(CompletionRequest, LogitBiasKeysAreCanonicalIdsAndLogprobsFalseIsOff) {
  EXPECT_EQ(refused_field(R"({"prompt": "x", "logit_bias": {"5": 100, "05": 100}})", false), "logit_bias.05");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "logit_bias": {"+5": 1}})", false), "logit_bias.+5");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "logit_bias": {" 5": 1}})", false), "logit_bias. 5");
  const CompletionRequest r = parse_completion_request(R"({"prompt": "x", "logprobs": false})", false, kLimits);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(refused_field(R"({"prompt": "x", "logprobs": true})", false), "logprobs");
}

TEST(CompletionRequest, ParsesEverySamplingField) {
  const CompletionRequest r = parse_completion_request(
      R"({"prompt": "x", "min_p": 0.05, "typical_p": 0.9, "repetition_penalty": 1.3, "repeat_last_n": -1,
          "presence_penalty": 0.5, "frequency_penalty": -0.25, "logit_bias": {"7": -100, "12": 2.5},
          "n": 3, "logprobs": 4, "top_k": 9})", false, kLimits);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.typical_p, 0.9f);
  EXPECT_FLOAT_EQ(r.repeat_penalty, 1.3f);
  EXPECT_EQ(r.repeat_last_n, -1);
  EXPECT_FLOAT_EQ(r.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, -0.25f);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0].id, 7);
  EXPECT_EQ(r.logit_bias[0].bias, kLogitBan);
  EXPECT_EQ(r.logit_bias[1].id, 12);
  EXPECT_FLOAT_EQ(r.logit_bias[1].bias, 2.5f);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_EQ(r.top_k, 9);
  const CompletionRequest c = parse_completion_request(
      R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20, "repeat_penalty": 1.1})",
      true, kLimits);
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 20);
  EXPECT_FLOAT_EQ(c.repeat_penalty, 1.1f);
  const CompletionRequest d = parse_completion_request(R"({"prompt": "x"})", false, kLimits);
  EXPECT_FALSE(d.logprobs);
  EXPECT_EQ(d.n, 1);
  EXPECT_TRUE(d.logit_bias.empty());
}

TEST(CompletionRequest, SamplingFieldsOutOfRangeName400) {
  const auto field = [](const std::string& extra) { return refused_field(R"({"prompt": "x", )" + extra + "}", false); };
  EXPECT_EQ(field(R"("min_p": 1.5)"), "min_p");
  EXPECT_EQ(field(R"("typical_p": 0)"), "typical_p");
  EXPECT_EQ(field(R"("repeat_penalty": 0)"), "repeat_penalty");
  EXPECT_EQ(field(R"("repeat_penalty": 1.1, "repetition_penalty": 1.1)"), "repetition_penalty");
  EXPECT_EQ(field(R"("repeat_last_n": -2)"), "repeat_last_n");
  EXPECT_EQ(field(R"("presence_penalty": 2.5)"), "presence_penalty");
  EXPECT_EQ(field(R"("frequency_penalty": "x")"), "frequency_penalty");
  EXPECT_EQ(field(R"("logit_bias": [1])"), "logit_bias");
  EXPECT_EQ(field(R"("logit_bias": {"abc": 1})"), "logit_bias.abc");
  EXPECT_EQ(field(R"("logit_bias": {"5": 101})"), "logit_bias.5");
  EXPECT_EQ(field(R"("logprobs": 21)"), "logprobs");
  EXPECT_EQ(field(R"("logprobs": true)"), "logprobs");  // the legacy endpoint takes a count
  EXPECT_EQ(field(R"("n": 0)"), "n");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", true), "top_logprobs");
}

TEST(CompletionRequest, DocsListEveryField) {
  std::ifstream f(std::string(MOESTREAM_SOURCE_DIR) + "/docs/server.md");
  ASSERT_TRUE(f) << "docs/server.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const RequestField& field : request_fields()) {
    std::string quoted(1, '`');
    quoted.append(field.name).push_back('`');
    EXPECT_NE(doc.find(quoted), std::string::npos) << "docs/server.md does not name " << quoted;
  }
}

// response_format and grammar become one ConstraintSpec; anything malformed is a 400 naming the
// exact field (the schema's own validity is checked where it compiles: ServerTest).
TEST(CompletionRequest, ResponseFormatAndGrammarParseIntoAConstraint) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  CompletionRequest r = parse_completion_request(chat + R"("response_format": {"type": "json_object"}})", true, kLimits);
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->kind, ConstraintSpec::Kind::kJsonObject);
  EXPECT_EQ(r.constraint_field, "response_format");
  r = parse_completion_request(chat + R"("response_format": {"type": "json_schema", "json_schema":
      {"name": "p", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})",
                               true, kLimits);
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->kind, ConstraintSpec::Kind::kJsonSchema);
  EXPECT_TRUE(r.constraint->strict);
  EXPECT_EQ(nlohmann::json::parse(r.constraint->text)["properties"]["a"]["type"], "integer");
  r = parse_completion_request(chat + R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})",
                               true, kLimits);
  EXPECT_FALSE(r.constraint->strict);  // OpenAI's default
  r = parse_completion_request(R"({"prompt": "x", "grammar": "root ::= \"a\""})", false, kLimits);
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->kind, ConstraintSpec::Kind::kGrammar);
  EXPECT_EQ(r.constraint->text, "root ::= \"a\"");
  EXPECT_FALSE(parse_completion_request(chat + R"("response_format": {"type": "text"}})", true, kLimits).constraint);

  EXPECT_EQ(refused_field(chat + R"("response_format": "json"})", true), "response_format");
  EXPECT_EQ(refused_field(chat + R"("response_format": {"type": "json_object", "x": 1}})", true), "response_format.x");
  EXPECT_EQ(refused_field(chat + R"("response_format": {"type": "json_schema"}})", true), "response_format.json_schema");
  EXPECT_EQ(refused_field(chat + R"("response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})", true),
            "response_format.json_schema.schema");
  EXPECT_EQ(refused_field(chat + R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": 1}}})", true),
            "response_format.json_schema.strict");
  EXPECT_EQ(refused_field(chat + R"("response_format": {"type": "json_schema", "json_schema": {"schema": {}, "z": 1}}})", true),
            "response_format.json_schema.z");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "grammar": 3})", false), "grammar");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "grammar": ""})", false), "grammar");
  EXPECT_EQ(refused_field(chat + R"("grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})", true), "grammar");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "grammar": "root ::= \"a\"", "ignore_eos": true})", false), "ignore_eos");
}

TEST(CompletionRequest, ToolsAreCheckedAndToolChoiceNoneWithdrawsThem) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  const CompletionRequest a = parse_completion_request("{" + msgs + ", " + tools + "}", true, kLimits);
  EXPECT_TRUE(a.parse_tool_calls);
  EXPECT_EQ(a.tools.size(), 1u);
  const CompletionRequest b = parse_completion_request("{" + msgs + ", " + tools + R"(, "tool_choice": "none"})", true, kLimits);
  EXPECT_FALSE(b.parse_tool_calls);
  EXPECT_TRUE(b.tools.is_null());  // not offered to the template either
  // required and a named function are enforced (the server builds the grammar): parsed here.
  EXPECT_EQ(*parse_completion_request("{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})",
                                      true, kLimits).forced_tool, "f");
  EXPECT_EQ(*parse_completion_request("{" + msgs + ", " + tools + R"(, "tool_choice": "required"})", true, kLimits).forced_tool, "");
  EXPECT_EQ(refused_field("{" + msgs + ", " + tools + R"(, "tool_choice": {"type": "function"}})", true), "tool_choice");
  EXPECT_EQ(refused_field("{" + msgs + ", " + tools + R"(, "tool_choice": "required", "grammar": "root ::= \"a\""})", true),
            "tool_choice");
  EXPECT_EQ(refused_field("{" + msgs + R"(, "tool_choice": "sometimes"})", true), "tool_choice");
  EXPECT_EQ(refused_field("{" + msgs + R"(, "tools": [{"type": "function", "function": {}}]})", true), "tools[0].function.name");
  EXPECT_EQ(refused_field("{" + msgs + R"(, "tools": [{"type": "retrieval"}]})", true), "tools[0].type");
  EXPECT_EQ(refused_field("{" + msgs + R"(, "parallel_tool_calls": false})", true), "parallel_tool_calls");
  EXPECT_EQ(refused_field("{" + msgs + R"(, "parallel_tool_calls": true})", true), "");
}

// A call sent back has its arguments as a JSON string; templates get the object.
TEST(CompletionRequest, AssistantToolCallsComeBackWithParsedArguments) {
  const CompletionRequest r = parse_completion_request(R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})", true, kLimits);
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"]["a"][1], 2);
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "c1");
  const auto call = [](const std::string& fn) {
    return refused_field(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": )" +
                         fn + "}]}]}", true);
  };
  EXPECT_EQ(call(R"({"name": "f", "arguments": "[1]"})"), "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(call(R"({"name": "f", "arguments": {"a": 1}})"), "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(call(R"({"arguments": "{}"})"), "messages[0].tool_calls[0].function.name");
  EXPECT_EQ(refused_field(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", true),
            "messages[0].tool_calls");
}

TEST(CompletionRequest, ForcedOutputIsAString) {
  EXPECT_EQ(*parse_completion_request(R"({"prompt": "x", "forced_output": "y"})", false, kLimits).forced_output, "y");
  EXPECT_EQ(refused_field(R"({"prompt": "x", "forced_output": 1})", false), "forced_output");
}
