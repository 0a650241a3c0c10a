// tokenizer.json "normalizer": Unicode normalisation forms (via utf8proc), Prepend, Replace and
// Sequence, applied to each stretch of text between added tokens.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "runtime/tokenizer/json_fields.h"

namespace moestream::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Writes the normalised `in` to `out` and returns true, or returns false when `in` is unchanged
  // (the common ASCII case, so the caller keeps its view and copies nothing).
  virtual bool normalize(std::string_view in, std::string& out) const = 0;
};

// Builds from a tokenizer.json normalizer object; ConfigError naming `path` when unsupported.
std::unique_ptr<Normalizer> make_normalizer(const Json& j, const JsonFields& f,
                                            const std::string& path);

}  // namespace moestream::tok
