// PCRE2 wrapper: compile once with JIT, match with a per-thread match block and JIT stack.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "runtime/tokenizer/pcre_regex.h"

#include <pcre2.h>

#include "common/error.h"
#include "runtime/tokenizer/unicode_ranges.h"

namespace moestream::tok {

namespace {

std::string pcre_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread matching state. The JIT stack grows to 8 MiB because patterns like `\s+(?!\S)`
// backtrack once per character over long whitespace runs.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    MOE_ASSERT(data && context && stack, "pcre2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

// Unicode White_Space, which is what `\s` means to Oniguruma (the reference's engine). PCRE2's
// `\s` under UCP also matches U+180E MONGOLIAN VOWEL SEPARATOR, which stopped being a space in
// Unicode 6.3, so `\s`/`\S` are spelled out.
constexpr std::string_view kWhiteSpaceMembers =
    "\\t\\n\\x0B\\f\\r\\x20\\x85\\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

}  // namespace

std::string translate_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[++i];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceMembers;
        } else {
          out += "[";
          out += kWhiteSpaceMembers;
          out += "]";
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceMembers;
        out += "]";
      } else if (e == 'd' || (e == 'D' && !in_class)) {
        // Decimal digits, with those Unicode 15-16 added.
        std::string members = std::string("\\p{Nd}") + kExtraDecimals;
        if (in_class) out += members;
        else out += (e == 'd' ? "[" : "[^") + members + "]";
      } else if ((e == 'p' || e == 'P') && i + 1 < pattern.size()) {
        // \p{L} / \p{N}: add what Unicode 15-16 assigned, which PCRE2 10.42 does not know.
        size_t name_start = i + 1, name_end = i + 2;
        if (pattern[name_start] == '{') {
          size_t close = pattern.find('}', name_start);
          name_end = close == std::string_view::npos ? pattern.size() : close + 1;
        }
        std::string_view whole = pattern.substr(i - 1, name_end - (i - 1));
        std::string_view name = pattern.substr(name_start, name_end - name_start);
        const char* extra = (name == "L" || name == "{L}") ? kExtraLetters
                            : (name == "N" || name == "{N}") ? kExtraNumbers : nullptr;
        if (!extra || (e == 'P' && in_class)) {
          out += whole;
        } else {
          std::string members = std::string("\\p{") + (extra == kExtraLetters ? "L" : "N") + "}" + extra;
          if (in_class) out += members;
          else out += (e == 'p' ? "[" : "[^") + members + "]";
        }
        i = name_end - 1;
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Regex::Regex(std::string_view source_pattern, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  std::string pattern = translate_oniguruma(source_pattern);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code_) {
    throw ConfigError(where + ": cannot compile regex at offset " + std::to_string(err_off) +
                      ": " + pcre_message(err));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view subject, size_t from, size_t& match_start,
                 size_t& match_end) const {
  MatchState& st = match_state();
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code_, s, subject.size(), from, 0, st.data, st.context)
                : pcre2_match(code_, s, subject.size(), from, PCRE2_NO_UTF_CHECK, st.data,
                              st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    throw Error(where_ + ": regex match failed at offset " + std::to_string(from) + ": " +
                pcre_message(rc));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  match_start = ov[0];
  match_end = ov[1];
  return true;
}

}  // namespace moestream::tok
