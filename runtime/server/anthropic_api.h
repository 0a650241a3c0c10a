// Anthropic's Messages API (POST /v1/messages) on the chat engine: its request as the OpenAI chat
// request it means, the reply as a message or as its stream of events, errors in its shape.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/reply_parser.h"
#include "runtime/server/api_error.h"
#include "runtime/server/job.h"

namespace moestream {

// Checks a Messages body field by field (ApiError 400 naming the field as Anthropic spells it,
// e.g. messages[1].content[0].tool_use_id) and returns the /v1/chat/completions body it means:
// system -> a system message; text blocks -> content; thinking blocks -> reasoning_content;
// tool_use -> tool_calls; tool_result -> tool messages; tools -> functions; stop_sequences ->
// stop; tool_choice auto/none; metadata.user_id -> user. docs/server.md lists what is refused.
nlohmann::ordered_json anthropic_to_chat_body(const nlohmann::ordered_json& body);

// "end_turn", "max_tokens", "stop_sequence" (a stop string matched) or "tool_use".
std::string anthropic_stop_reason(const std::string& finish_reason, bool stop_string, int n_calls);

struct AnthropicUsage {
  int input_tokens = 0, output_tokens = 0;
};

// The whole reply as a Messages response: thinking, text and tool_use content blocks.
nlohmann::json anthropic_message(const std::string& id, const std::string& model, const ReplyDelta& whole,
                                 const std::string& stop_reason, const std::string& stop_sequence,
                                 const AnthropicUsage& usage);

// {"type": "error", "error": {"type", "message"}}, the type Anthropic gives the status.
nlohmann::json anthropic_error_body(const ApiError& e);

// The whole reply (`text`, parsed by `reply`) of a finished job as a Messages response.
nlohmann::json anthropic_response(const std::string& id, const std::string& model, ReplyParser& reply,
                                  const std::string& text, const JobResult& r);

// The server-sent events of a streamed reply: message_start, then per content block
// content_block_start / content_block_delta... / content_block_stop, then message_delta and
// message_stop. A block is opened when the reply's kind of text changes.
class AnthropicEvents {
 public:
  std::string start(const std::string& id, const std::string& model, int input_tokens);
  std::string delta(const ReplyDelta& d);
  std::string finish(const std::string& stop_reason, const std::string& stop_sequence, const AnthropicUsage& usage);
  static std::string ping();
  static std::string error(const ApiError& e);
  // The events for a job's new text: message_start first; the end when `done` (the job's result
  // or error).
  std::string next(const std::string& id, const std::string& model, int input_tokens, ReplyParser& reply,
                   const std::string& text, bool done, const Job& job);

 private:
  enum class Block { kNone, kThinking, kText };
  std::string open(Block b, const nlohmann::json& content_block);
  std::string close();
  Block open_ = Block::kNone;
  int index_ = -1;
  bool started_ = false;
};

}  // namespace moestream
