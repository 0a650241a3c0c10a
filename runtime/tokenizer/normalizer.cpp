// Normalizers: NFC/NFD/NFKC/NFKD through utf8proc (only on non-ASCII stretches), Prepend,
// Replace (literal or regex) and Sequence, with the reference's semantics.
#include "runtime/tokenizer/normalizer.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>

#include <utf8proc.h>

#include "common/error.h"
#include "runtime/tokenizer/pcre_regex.h"
#include "runtime/tokenizer/unicode_ranges.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream::tok {

namespace {

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(utf8proc_option_t options) : options_(options) {}

  // No ASCII character composes with what precedes it or reorders, so the text splits into
  // independent stretches just before every ASCII byte; only stretches holding non-ASCII bytes
  // (plus the one ASCII char before them, which may compose with a following mark) go to utf8proc.
  bool normalize(std::string_view in, std::string& out) const override {
    size_t i = 0, n = in.size();
    while (i < n && static_cast<unsigned char>(in[i]) < 0x80) ++i;
    if (i == n) return false;
    out.clear();
    out.reserve(n + n / 8);
    size_t copied = 0;
    bool changed = false;
    while (i < n) {
      size_t start = i > 0 ? i - 1 : 0;  // the ASCII char before may be a composition base
      if (start > 0 && static_cast<unsigned char>(in[start]) >= 0x80) start = i;
      size_t end = i;
      while (end < n && static_cast<unsigned char>(in[end]) >= 0x80) ++end;
      out.append(in.substr(copied, start - copied));
      // Characters newer than the reference's Unicode 9.0 normalisation data pass through as
      // it treats them (unassigned: a starter that never composes), so they cut the stretch.
      size_t piece = start, k = i;
      while (k < end) {
        size_t at = k;
        char32_t cp = next_code_point(in, k);
        if (!after_unicode9(cp)) continue;
        changed |= map_append(in.substr(piece, at - piece), out);
        out.append(in.substr(at, k - at));
        piece = k;
      }
      changed |= map_append(in.substr(piece, end - piece), out);
      copied = end;
      i = end;
      while (i < n && static_cast<unsigned char>(in[i]) < 0x80) ++i;
    }
    out.append(in.substr(copied));
    return changed;
  }

 private:
  static bool after_unicode9(char32_t cp) {
    if (cp < kAfterUnicode9[0][0]) return false;
    const auto* end = std::end(kAfterUnicode9);
    const auto* it = std::upper_bound(std::begin(kAfterUnicode9), end, cp,
                                      [](char32_t c, const char32_t(&r)[2]) { return c < r[0]; });
    return it != std::begin(kAfterUnicode9) && cp <= (*(it - 1))[1];
  }

  // Appends the normalised `s` to out; true when it differs from `s`.
  bool map_append(std::string_view s, std::string& out) const {
    if (s.empty()) return false;
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                        static_cast<utf8proc_ssize_t>(s.size()), &dst, options_);
    if (len < 0) {
      throw FormatError(std::string("tokenizer: Unicode normalisation failed: ") +
                        utf8proc_errmsg(len));
    }
    std::string_view norm(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
    bool differs = norm != s;
    out.append(norm);
    std::free(dst);
    return differs;
  }

  utf8proc_option_t options_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  bool normalize(std::string_view in, std::string& out) const override {
    if (in.empty() || prefix_.empty()) return false;
    out.assign(prefix_);
    out.append(in);
    return true;
  }

 private:
  std::string prefix_;
};

class ReplaceLiteral : public Normalizer {
 public:
  ReplaceLiteral(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  bool normalize(std::string_view in, std::string& out) const override {
    if (from_.empty()) return false;
    size_t pos = in.find(from_);
    if (pos == std::string_view::npos) return false;
    out.clear();
    size_t copied = 0;
    while (pos != std::string_view::npos) {
      out.append(in.substr(copied, pos - copied));
      out.append(to_);
      copied = pos + from_.size();
      pos = in.find(from_, copied);
    }
    out.append(in.substr(copied));
    return true;
  }

 private:
  std::string from_, to_;
};

class ReplaceRegex : public Normalizer {
 public:
  ReplaceRegex(const std::string& pattern, std::string to, const std::string& where)
      : re_(pattern, where), to_(std::move(to)) {}
  bool normalize(std::string_view in, std::string& out) const override {
    size_t from = 0, s = 0, e = 0, copied = 0;
    bool any = false;
    while (from <= in.size() && re_.find(in, from, s, e)) {
      if (!any) out.clear();
      any = true;
      out.append(in.substr(copied, s - copied));
      out.append(to_);
      copied = e;
      // An empty match advances by one character, as Oniguruma's find_iter does.
      from = e > s ? e : e + (e < in.size() ? utf8_step(in, e) : 1);
    }
    if (!any) return false;
    out.append(in.substr(copied));
    return true;
  }

 private:
  static size_t utf8_step(std::string_view s, size_t i) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : 4;
  }
  Regex re_;
  std::string to_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  bool normalize(std::string_view in, std::string& out) const override {
    std::string cur, next;
    bool changed = false;
    std::string_view view = in;
    for (const auto& step : steps_) {
      if (step->normalize(view, next)) {
        cur.swap(next);
        view = cur;
        changed = true;
      }
    }
    if (changed) out.assign(view);
    return changed;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const JsonFields& f,
                                            const std::string& path) {
  std::string type = f.type_of(j, path);
  auto stable = static_cast<utf8proc_option_t>(UTF8PROC_STABLE);
  if (type == "NFC") return std::make_unique<UnicodeForm>(
      static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::make_unique<UnicodeForm>(
      static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") return std::make_unique<UnicodeForm>(
      static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  if (type == "NFKD") return std::make_unique<UnicodeForm>(
      static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  if (type == "Prepend") {
    return std::make_unique<Prepend>(f.str(f.at(j, "prepend", path), join_path(path, "prepend")));
  }
  if (type == "Replace") {
    ReplaceFields r = read_replace(f, j, path);
    if (r.literal) return std::make_unique<ReplaceLiteral>(std::move(*r.literal), std::move(r.content));
    if (r.regex) {
      const std::string rp = join_path(r.pattern_path, "Regex");
      return std::make_unique<ReplaceRegex>(f.str(*r.regex, rp), std::move(r.content), f.file() + ": " + rp);
    }
    f.bad(r.pattern_path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "Sequence")
    return std::make_unique<Sequence>(
        sequence_steps<Normalizer>(f, j, "normalizers", path, make_normalizer));
  f.unsupported_type(path, "normalizer", type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
}

}  // namespace moestream::tok
