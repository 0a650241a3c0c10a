// Decoder steps with the reference's exact per-token semantics (including its quirks: Metaspace
// drops every replacement char of the first token, ByteFallback turns each byte of an invalid
// run into one U+FFFD, ByteLevel repairs invalid UTF-8 lossily over the whole output).
#include "runtime/tokenizer/token_decoder.h"

#include "common/error.h"
#include "runtime/tokenizer/pcre_regex.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream::tok {

namespace {

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";

class ByteLevelDec : public TokenDecoder {
 public:
  VocabEncoding encoding() const override { return VocabEncoding::kByteLevel; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteLevelMap& m = byte_level_map();
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t before = bytes.size();
      size_t i = 0;
      bool ok = true;
      while (i < t.size()) {
        char32_t cp = next_code_point(t, i);
        if (cp >= 512 || m.cp_to_byte[cp] < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(m.cp_to_byte[cp]));
      }
      // A token with a char outside the map contributes its own UTF-8 bytes.
      if (!ok) {
        bytes.resize(before);
        bytes.append(t);
      }
    }
    std::string text;
    append_lossy(text, bytes);
    tokens.assign(1, std::move(text));
  }
};

class MetaspaceDec : public TokenDecoder {
 public:
  MetaspaceDec(std::string replacement, bool prepend) : replacement_(std::move(replacement)),
                                                       prepend_(prepend) {}
  VocabEncoding encoding() const override { return VocabEncoding::kMetaspace; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!(k == 0 && prepend_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[k] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class ByteFallbackDec : public TokenDecoder {
 public:
  VocabEncoding encoding() const override { return VocabEncoding::kMetaspace; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (find_invalid_utf8(bytes) == std::string::npos) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
    };
    for (std::string& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xNN>" -> NN, else -1.
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDec : public TokenDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec : public TokenDecoder {
 public:
  StripDec(char32_t content, size_t start, size_t stop) : content_(content), start_(start),
                                                          stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      size_t i = 0;
      while (i < t.size()) {
        size_t at = i;
        chars.emplace_back(at, next_code_point(t, i));
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < chars.size(); ++k) {
        if (chars[k].second != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < stop_ && k < chars.size(); ++k) {
        size_t idx = chars.size() - k - 1;
        if (chars[idx].second != content_) break;
        stop_cut = idx;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      size_t b0 = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t b1 = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b0, b1 - b0);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDec : public TokenDecoder {
 public:
  ReplaceDec(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return;
    for (std::string& t : tokens) {
      size_t pos = t.find(from_);
      if (pos == std::string::npos) continue;
      std::string out;
      size_t copied = 0;
      while (pos != std::string::npos) {
        out.append(t, copied, pos - copied);
        out.append(to_);
        copied = pos + from_.size();
        pos = t.find(from_, copied);
      }
      out.append(t, copied);
      t = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

class SequenceDec : public TokenDecoder {
 public:
  explicit SequenceDec(std::vector<std::unique_ptr<TokenDecoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }
  VocabEncoding encoding() const override {
    for (const auto& s : steps_)
      if (s->encoding() != VocabEncoding::kRaw) return s->encoding();
    return VocabEncoding::kRaw;
  }

 private:
  std::vector<std::unique_ptr<TokenDecoder>> steps_;
};

char32_t single_char(const JsonFields& f, const std::string& s, const std::string& path) {
  size_t i = 0;
  if (s.empty()) f.bad(path, "expected exactly one character");
  char32_t cp = next_code_point(s, i);
  if (i != s.size()) f.bad(path, "expected exactly one character");
  return cp;
}

}  // namespace

std::unique_ptr<TokenDecoder> make_token_decoder(const Json& j, const JsonFields& f,
                                                 const std::string& path) {
  std::string type = f.type_of(j, path);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Metaspace") {
    std::string rp = join_path(path, "replacement");
    std::string replacement = f.str(f.at(j, "replacement", path), rp);
    single_char(f, replacement, rp);
    bool prepend = true;
    if (const Json* ps = f.find(j, "prepend_scheme", path)) {
      std::string sp = join_path(path, "prepend_scheme");
      std::string s = f.str(*ps, sp);
      if (s != "always" && s != "first" && s != "never") {
        f.unsupported(sp, "unknown prepend_scheme '" + s + "'");
      }
      prepend = s != "never";
    } else {
      prepend = f.bool_or(j, "add_prefix_space", path, true);
    }
    return std::make_unique<MetaspaceDec>(replacement, prepend);
  }
  if (type == "Strip") {
    std::string cp = join_path(path, "content");
    char32_t content = single_char(f, f.str(f.at(j, "content", path), cp), cp);
    auto start = f.integer(f.at(j, "start", path), join_path(path, "start"), 0, 1 << 20);
    auto stop = f.integer(f.at(j, "stop", path), join_path(path, "stop"), 0, 1 << 20);
    return std::make_unique<StripDec>(content, static_cast<size_t>(start),
                                      static_cast<size_t>(stop));
  }
  if (type == "Replace") {
    ReplaceFields r = read_replace(f, j, path);
    if (r.literal) return std::make_unique<ReplaceDec>(std::move(*r.literal), std::move(r.content));
    f.unsupported(r.pattern_path, "only {\"String\": ...} patterns are supported in a Replace decoder");
  }
  if (type == "Sequence")
    return std::make_unique<SequenceDec>(
        sequence_steps<TokenDecoder>(f, j, "decoders", path, make_token_decoder));
  f.unsupported_type(path, "decoder", type,
                     "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence");
}

}  // namespace moestream::tok
