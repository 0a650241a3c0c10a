// Tokenizer::from_gguf: validates GGUF tokenizer metadata and assembles the same pipeline pieces
// that tokenizer.json builds (BpeModel, Split + ByteLevel pre-tokenizer, SentencePiece
// normalizer, decoders, added tokens) so that the result tokenizes as llama.cpp does.
#include "runtime/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/error.h"
#include "runtime/tokenizer/tokenizer_impl.h"
#include "runtime/tokenizer/utf8.h"

namespace moestream {

namespace {

using tok::Json;
using tok::utf8_len;

// llama.cpp's pre-tokenizers by tokenizer.ggml.pre name: regexes applied in turn, each isolating
// its matches as words (unmatched stretches stay words too), then GPT-2's byte-to-char map. The
// patterns are the ones the models' own tokenizer.json files use (llama.cpp spells some of them
// differently for its regex engine; PCRE2 takes the originals).
struct PreTokenizerSpec {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false;  // a word that is itself a token skips the merges (llama-3 family)
  bool add_bos = false;        // llama.cpp's add_bos_token default for these names
};

// Adjacent raw literals: each pattern is one string, cut at its alternatives for reading.
constexpr const char* kGpt2Regex =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
constexpr const char* kLlama3Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)re"
    R"re( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kQwen2Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)re"
    R"re( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kGpt4oRegex =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)re"
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)re"
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)re"
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)?|)re"
    R"re(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kTekkenRegex =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)re"
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)re"
    R"re(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// DeepSeek-V3: digit triples, CJK ideograph and kana runs, then the word pattern.
constexpr const char* kDeepseekV3Cjk =
    R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re";
constexpr const char* kDeepseekV3Words =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|)re"
    R"re([^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kDeepseekCoderCjk =
    R"re([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

const std::vector<PreTokenizerSpec>& pre_tokenizer_specs() {
  static const std::vector<PreTokenizerSpec> specs = {
      // llama.cpp's fallback when a file names none: punctuation runs, GPT-2 words, digit runs.
      {{"default"}, {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2Regex, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "gigachat", "exaone4"}, {kGpt2Regex}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"re(\p{N})re", kGpt2Regex}},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2Regex, "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"}, {kLlama3Regex}, true, true},
      {{"dbrx", "smaug-bpe", "glm4", "chatglm-bpe"}, {kLlama3Regex}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez"}, {kQwen2Regex}},
      {{"gpt-4o", "llama4"}, {kGpt4oRegex}},
      {{"tekken"}, {kTekkenRegex}, true, true},
      {{"deepseek-v3"}, {R"re(\p{N}{1,3})re", kDeepseekV3Cjk, kDeepseekV3Words}},
      {{"deepseek-coder"},
       {"[\\r\\n]", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kDeepseekCoderCjk, R"re(\p{N})re"}},
  };
  return specs;
}

constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Every message names the file and the key.
class Check {
 public:
  explicit Check(const GgufVocab& v)
      : src_(v.source.empty() ? std::string("GGUF tokenizer metadata") : v.source) {}
  const std::string& source() const { return src_; }
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw FormatError(src_ + ": " + key + ": " + what);
  }
  [[noreturn]] void unsupported(const std::string& key, const std::string& what) const {
    throw ConfigError(src_ + ": " + key + ": " + what);
  }

 private:
  std::string src_;
};

std::string at(const char* key, size_t i) { return std::string(key) + "[" + std::to_string(i) + "]"; }

// Quotes a token for a message, shortened so a hostile string cannot flood it.
std::string quote(std::string_view s) {
  constexpr size_t kMax = 64;
  return "'" + std::string(s.substr(0, kMax)) + (s.size() > kMax ? "...'" : "'");
}

GgufTokenType type_at(const GgufVocab& v, size_t i) {
  return v.token_types ? static_cast<GgufTokenType>((*v.token_types)[i]) : GgufTokenType::kNormal;
}

void check_arrays(const GgufVocab& v, const Check& c, bool llama) {
  size_t n = v.tokens.size();
  if (n == 0) c.bad(kGgufKeyTokens, "empty vocabulary");
  if (n > kGgufMaxTokens) {
    c.bad(kGgufKeyTokens,
          std::to_string(n) + " tokens exceed the limit of " + std::to_string(kGgufMaxTokens));
  }
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t len = v.tokens[i].size();
    if (len > kGgufMaxTokenBytes) {
      c.bad(at(kGgufKeyTokens, i), std::to_string(len) + " bytes exceed the limit of " +
                                       std::to_string(kGgufMaxTokenBytes));
    }
    // Everything downstream (matching, merging, decoding) assumes UTF-8, as tokenizer.json's is.
    size_t invalid = tok::find_invalid_utf8(v.tokens[i]);
    if (invalid != std::string::npos) {
      c.bad(at(kGgufKeyTokens, i), "not valid UTF-8 at byte " + std::to_string(invalid));
    }
    total += len;
  }
  if (total > kGgufMaxTotalTokenBytes) {
    c.bad(kGgufKeyTokens, std::to_string(total) + " bytes of token text exceed the limit of " +
                              std::to_string(kGgufMaxTotalTokenBytes));
  }
  auto same_length = [&](const char* key, size_t have) {
    if (have != n) {
      c.bad(key, "has " + std::to_string(have) + " entries but " + kGgufKeyTokens + " has " +
                     std::to_string(n));
    }
  };
  if (v.token_types) {
    same_length(kGgufKeyTokenType, v.token_types->size());
    for (size_t i = 0; i < n; ++i) {
      int32_t t = (*v.token_types)[i];
      if (t < 1 || t > 6) {
        c.bad(at(kGgufKeyTokenType, i), "unknown token type " + std::to_string(t) +
                                            " (1 normal, 2 unknown, 3 control, 4 user-defined, "
                                            "5 unused, 6 byte)");
      }
    }
  }
  if (v.scores) {
    same_length(kGgufKeyScores, v.scores->size());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite((*v.scores)[i])) c.bad(at(kGgufKeyScores, i), "not a finite number");
    }
  } else if (llama) {
    c.bad(kGgufKeyScores, "missing: model 'llama' merges by token score");
  }
  if (!llama) {
    if (!v.merges) c.bad(kGgufKeyMerges, "missing: model 'gpt2' needs its merges");
    if (v.merges->size() > kGgufMaxMerges) {
      c.bad(kGgufKeyMerges, std::to_string(v.merges->size()) + " merges exceed the limit of " +
                                std::to_string(kGgufMaxMerges));
    }
  }
}

// A special-token id from the file (or llama.cpp's default for the model kind), checked.
std::optional<int32_t> special_id(const GgufVocab& v, const Check& c, const char* key,
                                  const std::optional<int64_t>& value, std::optional<int64_t> dflt,
                                  bool must_have_text) {
  size_t n = v.tokens.size();
  std::optional<int64_t> id = value;
  if (!id && dflt && *dflt < static_cast<int64_t>(n)) id = dflt;
  if (!id) return std::nullopt;
  if (*id < 0 || *id >= static_cast<int64_t>(n)) {
    c.bad(key, "id " + std::to_string(*id) + " is outside the vocabulary [0, " + std::to_string(n) + ")");
  }
  auto i = static_cast<size_t>(*id);
  if (must_have_text && (type_at(v, i) == GgufTokenType::kUnused || v.tokens[i].empty())) {
    c.bad(key, "id " + std::to_string(*id) + " names an unused or empty token");
  }
  return static_cast<int32_t>(*id);
}

const PreTokenizerSpec& find_pre(const GgufVocab& v, const Check& c) {
  std::string name = v.pre.value_or("default");
  for (const auto& spec : pre_tokenizer_specs()) {
    if (std::find(spec.names.begin(), spec.names.end(), name) != spec.names.end()) return spec;
  }
  std::string known;
  for (const std::string& s : gguf_pre_tokenizer_names()) known += (known.empty() ? "" : ", ") + s;
  c.unsupported(kGgufKeyPre, "unknown pre-tokenizer " + quote(name) + " (supported: " + known + ")");
}

std::unique_ptr<tok::PreTokenizer> make_gpt2_pre(const PreTokenizerSpec& spec, const Check& c) {
  Json steps = Json::array();
  for (const char* re : spec.regexes) {
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"},
                     {"invert", false}});
  }
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  Json seq = {{"type", "Sequence"}, {"pretokenizers", steps}};
  return tok::make_pre_tokenizer(seq, tok::JsonFields(c.source()), kGgufKeyPre);
}

// gpt2: the file's merges, ranked by position; llama.cpp keeps the first of a repeated pair.
void add_gpt2_merges(const GgufVocab& v, const Check& c, tok::BpeModel& model) {
  const std::vector<std::string>& merges = *v.merges;
  struct Merge {
    int32_t left, right, merged;
  };
  std::vector<Merge> resolved(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string_view s = merges[i];
    size_t sp = s.find(' ', 1);
    if (sp == std::string_view::npos) {
      c.bad(at(kGgufKeyMerges, i), "expected \"left right\", found " + quote(s));
    }
    std::string_view a = s.substr(0, sp), b = s.substr(sp + 1);
    auto ia = model.token_to_id(a), ib = model.token_to_id(b);
    if (!ia) c.bad(at(kGgufKeyMerges, i), "token " + quote(a) + " is not in " + kGgufKeyTokens);
    if (!ib) c.bad(at(kGgufKeyMerges, i), "token " + quote(b) + " is not in " + kGgufKeyTokens);
    joined.assign(a);
    joined.append(b);
    auto im = model.token_to_id(joined);
    if (!im) c.bad(at(kGgufKeyMerges, i), "merged token " + quote(joined) + " is not in " + kGgufKeyTokens);
    resolved[i] = Merge{*ia, *ib, *im};
  }
  model.reserve_merges(resolved.size());
  for (size_t i = resolved.size(); i-- > 0;) {  // later adds overwrite: the first occurrence wins
    model.add_merge(resolved[i].left, resolved[i].right, static_cast<uint32_t>(i), resolved[i].merged);
  }
}

// llama (SentencePiece BPE): llama.cpp merges two adjacent symbols whenever their concatenation is
// a token, highest token score first, leftmost among equals. That is BPE whose merges are every
// split of a normal token into two tokens, ranked by the token's score (equal scores, equal rank).
void add_score_merges(const GgufVocab& v, const Check& c, tok::BpeModel& model) {
  struct Candidate {
    int32_t left, right, merged;
    float score;
  };
  std::vector<Candidate> candidates;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& t = v.tokens[id];
    if (type_at(v, id) != GgufTokenType::kNormal || t.empty()) continue;
    // A string held by several ids merges into the id it maps back to, as llama.cpp looks it up.
    std::optional<int32_t> merged = model.token_to_id(t);
    if (!merged) continue;
    size_t k = utf8_len(static_cast<unsigned char>(t[0]));
    while (k < t.size()) {
      std::string_view left(t.data(), k), right(t.data() + k, t.size() - k);
      auto il = model.token_to_id(left), ir = model.token_to_id(right);
      if (il && ir) candidates.push_back(Candidate{*il, *ir, *merged, (*v.scores)[*merged]});
      if (candidates.size() > kGgufMaxMerges) {
        c.bad(kGgufKeyTokens, "its tokens split into more than " + std::to_string(kGgufMaxMerges) +
                                  " pairs of tokens (merges)");
      }
      k += utf8_len(static_cast<unsigned char>(t[k]));
    }
  }
  std::vector<float> levels;
  levels.reserve(candidates.size());
  for (const auto& m : candidates) levels.push_back(m.score);
  std::sort(levels.begin(), levels.end(), std::greater<float>());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  model.reserve_merges(candidates.size());
  for (const auto& m : candidates) {
    auto it = std::lower_bound(levels.begin(), levels.end(), m.score, std::greater<float>());
    model.add_merge(m.left, m.right, static_cast<uint32_t>(it - levels.begin()), m.merged);
  }
}

}  // namespace

std::vector<std::string> gguf_pre_tokenizer_names() {
  std::vector<std::string> out;
  for (const auto& spec : pre_tokenizer_specs()) out.insert(out.end(), spec.names.begin(), spec.names.end());
  return out;
}

Tokenizer Tokenizer::from_gguf(const GgufVocab& v) {
  Check c(v);
  if (v.model.empty()) c.bad(kGgufKeyModel, "missing");
  if (v.model != "gpt2" && v.model != "llama") {
    c.unsupported(kGgufKeyModel, "tokenizer model " + quote(v.model) +
                                     " is not supported (supported: gpt2 = byte-level BPE, "
                                     "llama = SentencePiece BPE)");
  }
  const bool llama = v.model == "llama";
  check_arrays(v, c, llama);
  const size_t n = v.tokens.size();
  const PreTokenizerSpec* spec = llama ? nullptr : &find_pre(v, c);

  // llama.cpp's defaults for SentencePiece vocabularies: <unk> 0, <s> 1, </s> 2.
  auto dflt = [&](int64_t id) { return llama ? std::optional<int64_t>(id) : std::nullopt; };
  auto unk = special_id(v, c, kGgufKeyUnkId, v.unk_id, dflt(0), true);
  auto bos = special_id(v, c, kGgufKeyBosId, v.bos_id, dflt(1), true);
  auto eos = special_id(v, c, kGgufKeyEosId, v.eos_id, dflt(2), true);
  special_id(v, c, kGgufKeyPadId, v.pad_id, std::nullopt, false);

  auto im = std::make_unique<Impl>();
  im->source = c.source();
  im->vocab_size = static_cast<int32_t>(n);
  im->bos_id = bos;
  im->eos_id = eos;
  im->chat_template = v.chat_template;

  // The BPE vocabulary: every token but unused and empty ones (llama.cpp looks merge results up
  // among all of them).
  std::vector<std::string> texts(n);
  std::vector<bool> present(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (type_at(v, i) == GgufTokenType::kUnused || v.tokens[i].empty()) continue;
    texts[i] = v.tokens[i];
    present[i] = true;
  }
  tok::BpeModel::Options opts;
  if (llama) {
    opts.unk_id = unk;
    opts.byte_fallback = true;
    opts.fuse_unk = true;
  } else {
    opts.ignore_merges = spec->ignore_merges;
  }
  im->model = std::make_unique<tok::BpeModel>(std::move(texts), std::move(present), opts);
  tok::JsonFields fields(c.source());
  const bool space_prefix = llama && v.add_space_prefix.value_or(true);
  if (llama) {
    add_score_merges(v, c, *im->model);
    // Spaces become U+2581 and, with add_space_prefix, every stretch of text that starts the
    // input or follows a special token gets one in front (llama.cpp's SentencePiece session).
    Json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}};
    Json norm = replace;
    if (space_prefix) {
      norm = {{"type", "Sequence"},
              {"normalizers", {{{"type", "Prepend"}, {"prepend", kMetaspace}}, replace}}};
    }
    im->normalizer = tok::make_normalizer(norm, fields, kGgufKeyAddSpacePrefix);
  } else {
    add_gpt2_merges(v, c, *im->model);
    // tokenizer.ggml.add_space_prefix is not read here: llama.cpp's BPE never adds a space.
    im->pre_tokenizer = make_gpt2_pre(*spec, c);
    if (tok::ByteLevelPre* bl = im->pre_tokenizer->trailing_byte_level()) {
      bl->defer_mapping();
      im->model->set_byte_level_input(true);
    }
  }

  Json dec = {{"type", "ByteLevel"}};
  if (llama) {
    Json steps = {{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}}};
    if (space_prefix) steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    dec = {{"type", "Sequence"}, {"decoders", steps}};
  }
  im->decoder = tok::make_token_decoder(dec, fields, kGgufKeyModel);

  // Control, unknown and user-defined tokens are matched in the text before anything else, as
  // llama.cpp's special-token partition does; user-defined ones are not "special" for decode.
  for (size_t i = 0; i < n; ++i) {
    GgufTokenType t = type_at(v, i);
    if (v.tokens[i].empty() || (t != GgufTokenType::kControl && t != GgufTokenType::kUnknown &&
                                t != GgufTokenType::kUserDefined)) {
      continue;
    }
    tok::AddedToken a;
    a.content = v.tokens[i];
    a.id = static_cast<int32_t>(i);
    a.special = t != GgufTokenType::kUserDefined;
    a.normalized = false;
    im->added_by_id[a.id] = im->added.size();
    im->added_by_content[a.content] = a.id;
    im->added.push_back(std::move(a));
  }
  im->build_added_matchers();

  bool add_bos = v.add_bos.value_or(llama || spec->add_bos);
  bool add_eos = v.add_eos.value_or(false);
  if (add_bos && !bos) c.bad(kGgufKeyAddBos, std::string("is set but there is no ") + kGgufKeyBosId);
  if (add_eos && !eos) c.bad(kGgufKeyAddEos, std::string("is set but there is no ") + kGgufKeyEosId);
  if (add_bos) im->post_processor.prefix.push_back(*bos);
  if (add_eos) im->post_processor.suffix.push_back(*eos);
  return Tokenizer(std::move(im));
}

}  // namespace moestream
