// What a request's reply must match (response_format, grammar, a forced tool_choice), compiled
// against the served vocabulary; whatever cannot be enforced is a 400 naming the field.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "runtime/chat/reply_parser.h"  // ReplyFormat
#include "runtime/grammar/output_constraint.h"
#include "runtime/server/completion_request.h"

namespace moestream {

class RequestConstraints {
 public:
  // `tok` may be null (a model without a tokenizer: every constraint is a 400); `vocab_size` is
  // the width of the model's logits; `stop_ids` the tokens that end a reply.
  RequestConstraints(const Tokenizer* tok, int vocab_size, std::vector<int> stop_ids);
  ~RequestConstraints();

  // The request's constraint, or null when it asks for none. `format`: the chat template's
  // tool-call family; `prompt`: the request's prompt ids. Throws ApiError(400). Thread-safe.
  std::shared_ptr<const CompiledConstraint> compile(const CompletionRequest& r, ReplyFormat format,
                                                    const std::vector<int>& prompt);

 private:
  std::shared_ptr<const CompiledConstraint> compile_spec(const ConstraintSpec& spec, const std::string& field);
  ConstraintSpec forced_tool_calls(const CompletionRequest& r, ReplyFormat format, const std::vector<int>& prompt) const;

  const Tokenizer* tok_;
  int vocab_size_;
  std::vector<int> stop_ids_;
  // Built at the first constrained request (its vocabulary tables cost time on a large vocabulary).
  std::once_flag once_;
  std::unique_ptr<ConstraintCompiler> compiler_;
};

}  // namespace moestream
