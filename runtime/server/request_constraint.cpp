// Implementation of runtime/server/request_constraint.h.
#include "runtime/server/request_constraint.h"

#include <algorithm>

#include "runtime/grammar/tool_call_constraint.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

RequestConstraints::RequestConstraints(const Tokenizer* tok, int vocab_size, std::vector<int> stop_ids)
    : tok_(tok), vocab_size_(vocab_size), stop_ids_(std::move(stop_ids)) {}
RequestConstraints::~RequestConstraints() = default;

std::shared_ptr<const CompiledConstraint> RequestConstraints::compile(const CompletionRequest& r, ReplyFormat format,
                                                                      const std::vector<int>& prompt) {
  if (r.constraint) return compile_spec(*r.constraint, r.constraint_field);
  if (r.forced_tool) return compile_spec(forced_tool_calls(r, format, prompt), "tool_choice");
  return nullptr;
}

std::shared_ptr<const CompiledConstraint> RequestConstraints::compile_spec(const ConstraintSpec& spec,
                                                                           const std::string& field) {
  if (!tok_) throw ApiError(400, "no_tokenizer", "this model has no tokenizer: " + field + " cannot be enforced", field);
  if (stop_ids_.empty())
    throw ApiError(400, "invalid_request_error", "this model has no end-of-text token: " + field +
                   " cannot end its output", field);
  std::call_once(once_, [this] { compiler_ = std::make_unique<ConstraintCompiler>(*tok_, vocab_size_, stop_ids_); });
  try {
    return compiler_->compile(spec);
  } catch (const ConstraintError& e) {
    const std::string param = spec.kind == ConstraintSpec::Kind::kJsonSchema ? field + ".json_schema.schema" : field;
    throw ApiError(400, "invalid_request_error", param + ": " + e.what(), param);
  }
}

// The template's tool-call markup around each tool's parameters schema. Hermes markup only (the
// other families' markers are special tokens, which a constrained output may not hold).
ConstraintSpec RequestConstraints::forced_tool_calls(const CompletionRequest& r, ReplyFormat format,
                                                     const std::vector<int>& prompt) const {
  if (format != ReplyFormat::kHermes)
    throw ApiError(400, "invalid_request_error", "tool_choice: required and named functions are enforced for "
                   "Hermes-style tool calls (<tool_call>, Qwen2.5/Qwen3 templates); this model's template "
                   "writes " + std::string(reply_format_name(format)) + " markup", "tool_choice");
  if (!tok_) throw ApiError(400, "no_tokenizer", "this model has no tokenizer: tool_choice cannot be enforced", "tool_choice");
  // A reply may open with a reasoning block when the vocabulary has one and the prompt did not close it.
  const std::string tail = tok_->decode(std::vector<int32_t>(prompt.end() - std::min<size_t>(prompt.size(), 8), prompt.end()));
  const ToolCallChoice choice{*r.forced_tool, true,
                              tok_->token_id("<think>").has_value() && tail.find("</think>") == std::string::npos};
  try {
    return tool_call_constraint(ToolCallMarkup::kHermes, r.tools, choice);
  } catch (const ConstraintError& e) {
    throw ApiError(400, "invalid_request_error", std::string("tool_choice: ") + e.what(), "tool_choice");
  }
}

}  // namespace moestream
