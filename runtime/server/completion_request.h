// The body of POST /v1/completions and /v1/chat/completions, parsed and checked field by field:
// wrong types or ranges throw ApiError(400) naming the field; an unknown model ApiError(404).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

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
  nlohmann::ordered_json tools;          // chat: passed to the template (null when absent)
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::optional<int> max_tokens;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;                         // extension; 0 = no limit
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;            // stream_options.include_usage
  bool ignore_eos = false;               // extension (vLLM's name): generate past end-of-text
  std::vector<std::string> stop;
  std::optional<int64_t> replay_request;  // extension: the routing-log request to replay (--replay-routing)
};

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
