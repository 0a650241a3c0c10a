// Implementation of runtime/grammar/output_constraint.h over xgrammar (GrammarCompiler,
// GrammarMatcher and its token bitmask).
#include "runtime/grammar/output_constraint.h"

#include <xgrammar/xgrammar.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <limits>
#include <thread>

#include "runtime/model/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

class CompiledConstraint {
 public:
  CompiledConstraint(xgrammar::CompiledGrammar g, std::vector<int> stop_ids, int vocab_size,
                     std::shared_ptr<const std::vector<bool>> never)
      : grammar(std::move(g)), stop_ids(std::move(stop_ids)), vocab_size(vocab_size), never(std::move(never)) {}
  xgrammar::CompiledGrammar grammar;
  std::vector<int> stop_ids;
  int vocab_size;
  // Ids no output may hold (special tokens other than the stops, padding): refused before
  // xgrammar sees them, which would log a warning for each.
  std::shared_ptr<const std::vector<bool>> never;
};

namespace {

// JSON comes out compact, with ", " and ": " between items: allowing any whitespace lets a small
// model wander through newlines and spaces until max_tokens, which ends the output unparsed.
constexpr bool kAnyWhitespace = false;

xgrammar::VocabType xgrammar_vocab_type(VocabEncoding e) {
  switch (e) {
    case VocabEncoding::kByteLevel: return xgrammar::VocabType::BYTE_LEVEL;
    case VocabEncoding::kMetaspace: return xgrammar::VocabType::BYTE_FALLBACK;
    case VocabEncoding::kRaw: break;
  }
  return xgrammar::VocabType::RAW;
}

// The vocabulary as xgrammar reads it: each id's vocabulary string, "" (never allowed) for special
// tokens other than the stop ids, so a constrained output cannot spell "<|im_end|>" in a string.
xgrammar::TokenizerInfo tokenizer_info(const Tokenizer& tok, int vocab_size, const std::vector<int>& stop_ids) {
  if (vocab_size < tok.vocab_size())
    throw ConfigError("constrained decoding: the model's vocabulary (" + std::to_string(vocab_size) +
                      ") is smaller than the tokenizer's (" + std::to_string(tok.vocab_size()) + ")");
  std::vector<std::string> vocab(size_t(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const bool stop = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    if (tok.is_special(id) && !stop) continue;
    try {
      vocab[size_t(id)] = tok.token_text(id);
    } catch (const ConfigError&) {
      // an id the vocabulary skips: stays "", never allowed
    }
  }
  return xgrammar::TokenizerInfo(vocab, xgrammar_vocab_type(tok.vocab_encoding()), vocab_size,
                                 std::vector<int32_t>(stop_ids.begin(), stop_ids.end()));
}

// xgrammar ignores these keywords (a warning at most): a schema using them would be accepted and
// not enforced, so they are refused here, with where they are.
constexpr const char* kUnenforcedKeywords[] = {"not", "if", "then", "else", "dependentRequired",
                                              "dependentSchemas", "contains", "minContains",
                                              "maxContains", "uniqueItems"};

// Walks the subschemas of `s` (not property names or enum values, which may spell a keyword).
void refuse_unenforced(const nlohmann::json& s, const std::string& at) {
  if (!s.is_object()) return;
  for (const char* k : kUnenforcedKeywords)
    if (s.contains(k) && !(std::string_view(k) == "uniqueItems" && s[k] == false))
      throw ConstraintError("keyword \"" + std::string(k) + "\" at " + (at.empty() ? "/" : at) +
                            " is not supported by the constrained decoder");
  for (const char* k : {"properties", "patternProperties", "$defs", "definitions"})
    if (s.contains(k) && s[k].is_object())
      for (const auto& item : s[k].items()) refuse_unenforced(item.value(), at + "/" + k + "/" + item.key());
  for (const char* k : {"additionalProperties", "items", "propertyNames", "unevaluatedProperties"})
    if (s.contains(k)) refuse_unenforced(s[k], at + "/" + k);
  for (const char* k : {"anyOf", "oneOf", "allOf", "prefixItems"})
    if (s.contains(k) && s[k].is_array())
      for (size_t i = 0; i < s[k].size(); ++i) refuse_unenforced(s[k][i], at + "/" + k + "/" + std::to_string(i));
}

}  // namespace

struct ConstraintCompiler::Impl {
  std::vector<int> stop_ids;
  int vocab_size;
  std::shared_ptr<const std::vector<bool>> never;  // before compiler: make_compiler sets it
  xgrammar::GrammarCompiler compiler;
  Impl(const Tokenizer& tok, int vocab, std::vector<int> stops)
      : stop_ids(std::move(stops)), vocab_size(vocab), compiler(make_compiler(tok)) {}
  xgrammar::GrammarCompiler make_compiler(const Tokenizer& tok) {
    xgrammar::TokenizerInfo info = tokenizer_info(tok, vocab_size, stop_ids);
    auto n = std::make_shared<std::vector<bool>>(size_t(vocab_size), false);
    for (int32_t id : info.GetSpecialTokenIds()) (*n)[size_t(id)] = true;
    never = std::move(n);
    return xgrammar::GrammarCompiler(info, int(std::max(1u, std::min(8u, std::thread::hardware_concurrency()))));
  }
};

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tok, int vocab_size, std::vector<int> stop_ids)
    : impl_(std::make_unique<Impl>(tok, vocab_size, std::move(stop_ids))) {}
ConstraintCompiler::~ConstraintCompiler() = default;

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(const ConstraintSpec& spec) const {
  try {
    xgrammar::CompiledGrammar g = [&] {
      switch (spec.kind) {
        case ConstraintSpec::Kind::kJsonObject:
          // Any JSON object: the schema {"type": "object"} under JSON Schema's defaults.
          return impl_->compiler.CompileJSONSchema(R"({"type": "object"})", kAnyWhitespace,
                                                   std::nullopt, std::nullopt, /*strict_mode=*/false);
        case ConstraintSpec::Kind::kJsonSchema:
          if (nlohmann::json j = nlohmann::json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
              !j.is_discarded())
            refuse_unenforced(j, "");  // unparsable text: xgrammar's message says why
          return impl_->compiler.CompileJSONSchema(spec.text, kAnyWhitespace, std::nullopt,
                                                   std::nullopt, spec.strict);
        case ConstraintSpec::Kind::kGrammar:
          return impl_->compiler.CompileGrammar(spec.text, "root");
        case ConstraintSpec::Kind::kStructuralTag:
          return impl_->compiler.CompileStructuralTag(spec.text);
      }
      throw ConstraintError("unknown constraint kind");
    }();
    return std::make_shared<const CompiledConstraint>(std::move(g), impl_->stop_ids, impl_->vocab_size, impl_->never);
  } catch (const ConstraintError&) {
    throw;
  } catch (const std::exception& e) {  // xgrammar reports bad input as exceptions with a message
    throw ConstraintError(e.what());
  }
}

struct ConstraintMatcher::Impl {
  std::shared_ptr<const CompiledConstraint> c;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bitmask;  // bit i of word i/32: token i may come next
  std::vector<float> masked;     // sample()'s copy of the logits, masked
  explicit Impl(std::shared_ptr<const CompiledConstraint> cc)
      : c(std::move(cc)), matcher(c->grammar, c->stop_ids),
        bitmask(size_t(xgrammar::GetBitmaskSize(c->vocab_size))) {}
};

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> c)
    : impl_(std::make_unique<Impl>(std::move(c))) {}
ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;
ConstraintMatcher& ConstraintMatcher::operator=(ConstraintMatcher&&) noexcept = default;

void ConstraintMatcher::mask(std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  Impl& im = *impl_;
  const int vocab = im.c->vocab_size;
  for (size_t i = size_t(vocab); i < logits.size(); ++i) logits[i] = kNegInf;
  int64_t shape[1] = {int64_t(im.bitmask.size())};
  DLTensor t{};
  t.data = im.bitmask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  if (!im.matcher.FillNextTokenBitmask(&t)) return;  // every token allowed
  const size_t n = std::min(logits.size(), size_t(vocab));
  for (size_t w = 0; w * 32 < n; ++w) {
    // Walk the cleared bits only: most words of a JSON mask are all-zero or all-one.
    uint32_t banned = ~uint32_t(im.bitmask[w]);
    while (banned) {
      const size_t id = w * 32 + size_t(std::countr_zero(banned));
      if (id >= n) break;
      logits[id] = kNegInf;
      banned &= banned - 1;
    }
  }
}

void ConstraintMatcher::accept(int id) {
  if (!try_accept(id))
    throw ConstraintError("constrained decoding: token " + std::to_string(id) +
                          " does not continue the output's grammar");
}

bool ConstraintMatcher::try_accept(int id) {
  const CompiledConstraint& c = *impl_->c;
  if (id < 0 || id >= c.vocab_size || (*c.never)[size_t(id)]) return false;
  return impl_->matcher.AcceptToken(id);
}

int ConstraintMatcher::sample(Sampler& sampler, std::span<const float> logits) {
  if (!sampler.filters()) {
    const int id = sampler.draw(logits);
    if (try_accept(id)) {
      sampler.record(id);
      return id;
    }
  }
  std::vector<float>& m = impl_->masked;
  m.assign(logits.begin(), logits.end());
  mask(m);
  const int id = sampler.draw(m);
  accept(id);
  sampler.record(id);
  return id;
}

bool ConstraintMatcher::terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace moestream
