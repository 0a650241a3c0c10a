// OpenAI's response shapes: a parsed chat reply (runtime/chat/reply_parser.h) as the message of
// a response, the delta of a streamed chunk and the finish reason; usage and our timings.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/chat/reply_parser.h"
#include "runtime/server/job.h"

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
// The prompt counts once, as OpenAI counts it for n choices; its cache reuse is the first choice's.
nlohmann::json openai_usage(const std::vector<JobResult>& choices);
// The response's timings object (an extension): queue, prefill, decode, routing ids, cache-aware.
nlohmann::json openai_timings(const JobResult& r);

}  // namespace moestream
