// The body of POST /v1/completions and /v1/chat/completions, parsed and checked field by field:
// wrong types or ranges throw ApiError(400) naming the field; an unknown model ApiError(404).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/generate.h"  // SamplerParams
#include "runtime/grammar/output_constraint.h"  // ConstraintSpec
#include "runtime/server/api_error.h"

namespace moestream {

struct RequestLimits {
  std::string model_id;  // the one model served; a request naming another gets 404
  int max_context = 0;   // max_tokens above this is rejected outright
};

struct CompletionRequest {
  bool chat = false;
  std::string prompt;                    // completions: prompt text
  std::vector<int> prompt_ids;           // completions: prompt given as token ids
  nlohmann::ordered_json messages;       // chat: messages with content flattened to strings
  nlohmann::ordered_json tools;          // chat: passed to the template (null when absent or tool_choice none)
  bool parse_tool_calls = false;         // chat: tools offered, so the reply's tool calls are parsed
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::optional<int> max_tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;                         // extension; 0 = no limit
  float min_p = 0.0f;                    // extension; 0 = off
  float typical_p = 1.0f;                // extension; 1 = off
  float repeat_penalty = 1.0f;           // extension (llama.cpp; vLLM's repetition_penalty); 1 = off
  int repeat_last_n = 64;                // extension: repeat_penalty's window; -1 = all tokens
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<LogitBias> logit_bias;     // ids unchecked against the vocabulary (the server does that)
  std::optional<uint64_t> seed;
  int n = 1;                             // choices
  // Log-probabilities of each generated token and of the `top_logprobs` most likely ones
  // (chat: logprobs + top_logprobs; completions: logprobs = the count).
  bool logprobs = false;
  int top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool ignore_eos = false;               // extension (vLLM's name): generate past end-of-text
  std::vector<std::string> stop;
  std::optional<int64_t> replay_request;  // extension: the routing-log request to replay (`replay_routing`)
  // response_format json_object/json_schema or the `grammar` extension: what the output must match,
  // and the field it came from (for a 400 when it does not compile).
  std::optional<ConstraintSpec> constraint;
  std::string constraint_field;
  // tool_choice "required" ("") or {"type": "function", "function": {"name": N}} (N): the reply
  // must be tool calls (one of N), enforced like response_format (the server builds the grammar).
  std::optional<std::string> forced_tool;
  // Test hook (server flag `test_forced_output`): the reply's text, decoded token by token
  // through the normal path instead of sampled, then the end of the turn.
  std::optional<std::string> forced_output;
};

// Every request field this server knows, in one place: where it applies and what it does with it.
// A field not listed (or listed for the other endpoint) and a kRefused one are a 400 naming it;
// kDefaultOnly ones are accepted at their no-op value only (the note says which). A null value is
// the field's absence. docs/server.md lists the same (server_test checks it).
enum class FieldEndpoint : uint8_t { kBoth, kCompletions, kChat };
enum class FieldUse : uint8_t { kHonoured, kDefaultOnly, kRefused };
struct RequestField {
  std::string_view name;
  FieldEndpoint endpoint;
  FieldUse use;
  std::string_view note;  // kDefaultOnly: the accepted value; else what is done with it, if not plain
};
std::span<const RequestField> request_fields();

// Deepest nesting of arrays and objects a request body may have, in any field (ignored ones
// included). Copying, comparing and dumping a JSON value recurse once per level, so an unbounded
// depth could overflow the stack; real requests (messages, tool schemas) stay far below this.
inline constexpr int kMaxRequestJsonDepth = 64;

// Throws ApiError(400, "json_too_deep") when `body` opens more than `max_depth` arrays/objects at
// once. A linear scan that skips strings; it runs before any (recursive) JSON code sees the body
// and does not need the body to be valid JSON.
void check_json_depth(std::string_view body, int max_depth = kMaxRequestJsonDepth);

// Checks the depth first (check_json_depth), then parses.
CompletionRequest parse_completion_request(const std::string& body, bool chat, const RequestLimits& limits);

}  // namespace moestream
