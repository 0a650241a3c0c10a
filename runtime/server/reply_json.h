// A parsed chat reply (runtime/chat/reply_parser.h) in OpenAI's shapes: the message of a
// response, the delta of a streamed chunk, and the finish reason.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/reply_parser.h"

namespace moestream {

// {"type": "function", "id", "function": {"name", "arguments"}}.
nlohmann::json openai_tool_call(const ToolCall& c);
// {"role": "assistant", "content" (null when only calls came), "reasoning_content"?, "tool_calls"?}.
nlohmann::json openai_message(const ReplyDelta& whole);
// Adds d's fields to a chunk's delta: content, reasoning_content, tool_calls (each whole, numbered
// from next_call on, which it advances).
void add_openai_delta(nlohmann::json& delta, const ReplyDelta& d, int& next_call);
// "tool_calls" when the reply ended (not cut by max_tokens) after calling tools, else the engine's.
std::string reply_finish_reason(const std::string& engine_reason, int n_calls);

}  // namespace moestream
