// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available) standing in for the
// Oniguruma regexes of tokenizer.json; matching state lives per thread so one Regex is shareable.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;

namespace moestream::tok {

// Rewrites the Oniguruma constructs whose PCRE2 meaning differs: `\s`/`\S` (White_Space) and
// `\p{L}`/`\p{N}`/`\d` (extended to the reference's Unicode 16 letters, numbers and digits).
// `\w` is left to PCRE2 (its Unicode 14 word class), a known gap no shipped pattern uses.
std::string translate_oniguruma(std::string_view pattern);

class Regex {
 public:
  // Throws ConfigError("<where>: cannot compile regex ...") when PCRE2 rejects the pattern.
  Regex(std::string_view pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // First match in subject[from..]; false when none. `subject` must be valid UTF-8.
  bool find(std::string_view subject, size_t from, size_t& match_start, size_t& match_end) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string where_;
};

}  // namespace moestream::tok
