// Pre-tokenizers: regex/literal Split with the five delimiter behaviours, GPT-2 ByteLevel,
// SentencePiece Metaspace, Digits and Sequence.
#include "runtime/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <optional>

#include <utf8proc.h>

#include "common/error.h"
#include "runtime/tokenizer/pcre_regex.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream::tok {

// GPT-2's word regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Finds delimiter spans (regex or literal) and cuts a piece by a behaviour.
class Splitter {
 public:
  Splitter(std::string_view regex, const std::string& where) : re_(std::in_place, regex, where) {}
  explicit Splitter(std::string literal) : literal_(std::move(literal)) {}

  // Appends the pieces of `p` to `out`.
  void split(const Piece& p, SplitBehavior behavior, bool invert, std::vector<Piece>& out) const {
    std::string_view s = p.text;
    // (start, end, is_match) spans covering s, as the reference's Pattern::find_matches.
    spans_.clear();
    size_t prev = 0, from = 0, ms = 0, me = 0;
    while (from <= s.size() && next(s, from, ms, me)) {
      if (me == ms) {  // empty match: skip a character
        from = ms + (ms < s.size() ? utf8_len(static_cast<unsigned char>(s[ms])) : 1);
        continue;
      }
      if (prev != ms) spans_.push_back({prev, ms, false});
      spans_.push_back({ms, me, true});
      prev = me;
      from = me;
    }
    if (prev != s.size()) spans_.push_back({prev, s.size(), false});
    if (invert) {
      for (auto& sp : spans_) sp.is_match = !sp.is_match;
    }
    auto emit = [&](size_t a, size_t b) {
      if (b > a) out.push_back({s.substr(a, b - a), p.at_origin && a == 0});
    };
    // The reference's fold over (span, is_match); every output span is then a piece.
    merged_.clear();
    bool previous_match = false;
    switch (behavior) {
      case SplitBehavior::kRemoved:
        for (const auto& sp : spans_) if (!sp.is_match) merged_.push_back({sp.start, sp.end, false});
        break;
      case SplitBehavior::kIsolated:
        merged_ = spans_;
        break;
      case SplitBehavior::kContiguous:
        for (const auto& sp : spans_) {
          if (sp.is_match == previous_match && !merged_.empty()) merged_.back().end = sp.end;
          else merged_.push_back(sp);
          previous_match = sp.is_match;
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const auto& sp : spans_) {
          if (sp.is_match && !previous_match && !merged_.empty()) merged_.back().end = sp.end;
          else merged_.push_back(sp);
          previous_match = sp.is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (size_t k = spans_.size(); k-- > 0;) {
          const auto& sp = spans_[k];
          if (sp.is_match && !previous_match && !merged_.empty()) merged_.back().start = sp.start;
          else merged_.push_back(sp);
          previous_match = sp.is_match;
        }
        std::reverse(merged_.begin(), merged_.end());
        break;
    }
    for (const auto& sp : merged_) emit(sp.start, sp.end);
  }

 private:
  struct Span {
    size_t start, end;
    bool is_match;
  };
  bool next(std::string_view s, size_t from, size_t& ms, size_t& me) const {
    if (re_) return re_->find(s, from, ms, me);
    if (literal_.empty()) return false;
    size_t pos = s.find(literal_, from);
    if (pos == std::string_view::npos) return false;
    ms = pos;
    me = pos + literal_.size();
    return true;
  }
  std::optional<Regex> re_;
  std::string literal_;
  static thread_local std::vector<Span> spans_, merged_;
};

thread_local std::vector<Splitter::Span> Splitter::spans_;
thread_local std::vector<Splitter::Span> Splitter::merged_;

namespace {

class SplitPre : public PreTokenizer {
 public:
  SplitPre(std::unique_ptr<Splitter> splitter, SplitBehavior behavior, bool invert)
      : splitter_(std::move(splitter)), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces, PieceArena&) const override {
    thread_local std::vector<Piece> out;
    out.clear();
    for (const auto& p : pieces) splitter_->split(p, behavior_, invert_, out);
    pieces.swap(out);
  }

 private:
  std::unique_ptr<Splitter> splitter_;
  SplitBehavior behavior_;
  bool invert_;
};

class MetaspacePre : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePre(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split),
        splitter_(replacement_) {}
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override {
    thread_local std::vector<Piece> out;
    out.clear();
    for (const auto& p : pieces) {
      std::string& s = arena.emplace_back();
      bool starts = p.text.substr(0, replacement_.size()) == replacement_;
      // A leading space becomes the replacement too, so test after replacing.
      if (!starts && !p.text.empty() && p.text[0] == ' ') starts = true;
      if (!starts && (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_origin))) {
        s = replacement_;
      }
      for (char c : p.text) {
        if (c == ' ') s += replacement_; else s.push_back(c);
      }
      Piece np{s, p.at_origin};
      if (split_) {
        splitter_.split(np, SplitBehavior::kMergedWithNext, false, out);
      } else if (!s.empty()) {
        out.push_back(np);
      }
    }
    pieces.swap(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  Splitter splitter_;
};

class DigitsPre : public PreTokenizer {
 public:
  explicit DigitsPre(bool individual) : individual_(individual) {}
  void apply(std::vector<Piece>& pieces, PieceArena&) const override {
    thread_local std::vector<Piece> out;
    out.clear();
    for (const auto& p : pieces) {
      std::string_view s = p.text;
      size_t i = 0, start = 0;
      bool in_digits = false;
      auto emit = [&](size_t a, size_t b) {
        if (b > a) out.push_back({s.substr(a, b - a), p.at_origin && a == 0});
      };
      // The reference's Digits uses char::is_numeric (Unicode N*); ASCII is the common case.
      while (i < s.size()) {
        size_t at = i;
        char32_t cp = next_code_point(s, i);
        bool digit = is_numeric(cp);
        if (individual_) {
          if (digit) {
            emit(start, at);
            emit(at, i);
            start = i;
          }
        } else if (digit != in_digits) {
          emit(start, at);
          start = at;
          in_digits = digit;
        }
      }
      emit(start, s.size());
    }
    pieces.swap(out);
  }

 private:
  static bool is_numeric(char32_t cp);
  bool individual_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override {
    for (const auto& s : steps_) s->apply(pieces, arena);
  }
  ByteLevelPre* trailing_byte_level() override {
    return steps_.empty() ? nullptr : steps_.back()->trailing_byte_level();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

bool DigitsPre::is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

}  // namespace

ByteLevelPre::ByteLevelPre(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space) {
  if (use_regex) splitter_ = std::make_unique<Splitter>(kGpt2Pattern, "ByteLevel regex");
}

ByteLevelPre::~ByteLevelPre() = default;

void ByteLevelPre::apply(std::vector<Piece>& pieces, PieceArena& arena) const {
  if (add_prefix_space_) {
    for (auto& p : pieces) {
      if (!p.text.empty() && p.text[0] != ' ') {
        std::string& s = arena.emplace_back(" ");
        s.append(p.text);
        p.text = s;
      }
    }
  }
  if (splitter_) {
    thread_local std::vector<Piece> out;
    out.clear();
    for (const auto& p : pieces) splitter_->split(p, SplitBehavior::kIsolated, false, out);
    pieces.swap(out);
  }
  if (map_bytes_) {
    const ByteLevelMap& m = byte_level_map();
    for (auto& p : pieces) {
      std::string& s = arena.emplace_back();
      s.reserve(p.text.size() * 2);
      for (char c : p.text) s.append(m.byte_to_utf8[static_cast<unsigned char>(c)]);
      p.text = s;
    }
  }
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const JsonFields& f,
                                                 const std::string& path) {
  std::string type = f.type_of(j, path);
  if (type == "Split") {
    const Json& pat = f.at(j, "pattern", path);
    std::string pp = join_path(path, "pattern");
    std::unique_ptr<Splitter> splitter;
    if (const Json* s = f.find(pat, "String", pp)) {
      splitter = std::make_unique<Splitter>(f.str(*s, join_path(pp, "String")));
    } else if (const Json* r = f.find(pat, "Regex", pp)) {
      std::string rp = join_path(pp, "Regex");
      splitter = std::make_unique<Splitter>(f.str(*r, rp), f.file() + ": field '" + rp + "'");
    } else {
      f.bad(pp, "expected {\"String\": ...} or {\"Regex\": ...}");
    }
    std::string bp = join_path(path, "behavior");
    std::string b = f.str(f.at(j, "behavior", path), bp);
    SplitBehavior behavior;
    if (b == "Removed") behavior = SplitBehavior::kRemoved;
    else if (b == "Isolated") behavior = SplitBehavior::kIsolated;
    else if (b == "MergedWithPrevious") behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous") behavior = SplitBehavior::kContiguous;
    else f.unsupported(bp, "unknown split behavior '" + b + "'");
    return std::make_unique<SplitPre>(std::move(splitter), behavior,
                                      f.bool_or(j, "invert", path, false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPre>(f.bool_or(j, "add_prefix_space", path, true),
                                          f.bool_or(j, "use_regex", path, true));
  }
  if (type == "Metaspace") {
    std::string rp = join_path(path, "replacement");
    std::string replacement = f.str(f.at(j, "replacement", path), rp);
    size_t i = 0;
    if (replacement.empty() || (next_code_point(replacement, i), i != replacement.size())) {
      f.bad(rp, "expected exactly one character");
    }
    MetaspacePre::Prepend prepend = MetaspacePre::Prepend::kAlways;
    if (const Json* ps = f.find(j, "prepend_scheme", path)) {
      std::string sp = join_path(path, "prepend_scheme");
      std::string s = f.str(*ps, sp);
      if (s == "always") prepend = MetaspacePre::Prepend::kAlways;
      else if (s == "first") prepend = MetaspacePre::Prepend::kFirst;
      else if (s == "never") prepend = MetaspacePre::Prepend::kNever;
      else f.unsupported(sp, "unknown prepend_scheme '" + s + "'");
    } else if (!f.bool_or(j, "add_prefix_space", path, true)) {
      prepend = MetaspacePre::Prepend::kNever;  // pre-0.19 files
    }
    return std::make_unique<MetaspacePre>(replacement, prepend, f.bool_or(j, "split", path, true));
  }
  if (type == "Digits") {
    return std::make_unique<DigitsPre>(f.bool_or(j, "individual_digits", path, false));
  }
  if (type == "Sequence")
    return std::make_unique<SequencePre>(
        sequence_steps<PreTokenizer>(f, j, "pretokenizers", path, make_pre_tokenizer));
  f.unsupported_type(path, "pre_tokenizer", type, "Split, ByteLevel, Metaspace, Digits, Sequence");
}

}  // namespace moestream::tok
