// tool_choice "required" or a named function, enforced: a ConstraintSpec whose output is one or
// more tool calls in the chat format's markup, each call's arguments held to its tool's JSON
// Schema (xgrammar's structural tags: fixed text around schema-constrained JSON).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/grammar/output_constraint.h"

namespace moestream {

// The chat formats whose tool-call markup can be enforced.
enum class ToolCallMarkup {
  // Hermes / Qwen2.5 / Qwen3: <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>,
  // calls separated by "\n"; a leading <think>...</think> block is allowed when `thinking`.
  kHermes,
};

struct ToolCallChoice {
  std::string name;       // a forced function; empty: any of the tools ("required")
  bool parallel = true;   // more than one call (OpenAI's parallel_tool_calls)
  bool thinking = false;  // the template lets the reply open with a <think> block
};

// `tools`: OpenAI's list of {"type": "function", "function": {"name", "parameters"?, ...}}. Throws
// ConstraintError naming the problem (no tools, a malformed entry, a forced name not among them).
ConstraintSpec tool_call_constraint(ToolCallMarkup markup, const nlohmann::ordered_json& tools,
                                    const ToolCallChoice& choice);

}  // namespace moestream
