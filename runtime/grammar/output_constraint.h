// Constrained decoding: the output of a request must match a JSON schema, any JSON object, or a
// grammar. Compiled once per request against the served vocabulary; each sequence then masks the
// logits before sampling and feeds back the token it took. The engine is xgrammar's C++ core.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace moestream {

class Sampler;
class Tokenizer;

// What a request asks its output to match.
struct ConstraintSpec {
  enum class Kind { kJsonObject, kJsonSchema, kGrammar, kStructuralTag };
  Kind kind = Kind::kJsonObject;
  // kJsonSchema: the schema as JSON text; kGrammar: xgrammar's EBNF (GBNF-like: `root ::= ...`,
  // "literals", [classes], ( ) * + ? |, rule references); kStructuralTag: xgrammar's structural
  // tag JSON (tool_call_constraint.h builds them); kJsonObject: unused.
  std::string text;
  // kJsonSchema: true = OpenAI's strict mode (objects take only the listed properties and arrays
  // only the listed items unless the schema says otherwise); false = JSON Schema's defaults.
  bool strict = true;
};

// A schema or grammar that cannot be compiled (invalid JSON, an unsupported keyword, a grammar
// syntax error); the message says what.
class ConstraintError : public Error {
 public:
  using Error::Error;
};

class CompiledConstraint;

// Compiles ConstraintSpecs for one vocabulary. Thread-safe; keeps a cache of compiled specs (a
// schema sent again compiles once).
class ConstraintCompiler {
 public:
  // `vocab_size`: the width of the model's logits (at least tok.vocab_size(); ids past the
  // tokenizer's are never allowed). `stop_ids`: the tokens that may end a complete output.
  ConstraintCompiler(const Tokenizer& tok, int vocab_size, std::vector<int> stop_ids);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // Throws ConstraintError.
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One sequence's position in a compiled constraint. Not thread-safe (one per sequence).
class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<const CompiledConstraint> c);
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;
  ConstraintMatcher& operator=(ConstraintMatcher&&) noexcept;

  // Sets to -inf every logit whose token cannot come next; a stop token is allowed only where the
  // output is complete. Logits past the vocabulary are masked too.
  void mask(std::span<float> logits);
  // Advances past `id`, which mask() allowed. Throws ConstraintError for a token it forbade.
  void accept(int id);
  // Advances past `id` when it can continue the output; false (nothing changes) when it cannot.
  bool try_accept(int id);
  // True once a stop token was accepted: the output is complete.
  bool terminated() const;

  // The next token from `sampler` over `logits` (left as they are, for logprobs) under this
  // constraint, accepted and recorded. The draw is exactly a draw from the masked logits: without
  // the sampler's filters (or at temperature 0) the raw logits are drawn from first and the mask
  // is computed only when that token cannot continue the output (a draw from p, kept when
  // allowed, else redrawn from p over the allowed set, picks t with probability p(t) / p(allowed));
  // with filters the mask comes first, as they must see the masked distribution.
  int sample(Sampler& sampler, std::span<const float> logits);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moestream
