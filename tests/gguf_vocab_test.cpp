// Tokenizer::from_gguf: the real Qwen3, Llama-2 and GPT-2 vocabularies converted to GGUF tokenizer
// metadata the way llama.cpp's converter does must encode and decode token for token like the
// tokenizer.json path; hand-built vocabularies pin the SentencePiece merge order, the
// pre-tokenizer table and every validation error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/tokenizer/gguf_vocab.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"
#include "tests/support/strict_skip.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;
using Json = nlohmann::json;

constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

// ../shared/tokenizers beside the clone; MOESTREAM_SHARED_TOKENIZERS points elsewhere (a worktree).
fs::path shared_tokenizers() {
  if (const char* dir = std::getenv("MOESTREAM_SHARED_TOKENIZERS")) return dir;
  return fs::path(MOESTREAM_SOURCE_DIR).parent_path() / "shared" / "tokenizers";
}

Json read_json(const fs::path& p) { return Json::parse(read_file(p)); }

// The converter's rule for added tokens that are not marked special but are control tokens.
bool looks_special(const std::string& t) {
  auto ends = [&](const char* a, const char* b) {
    std::string s(a), e(b);
    return t.size() >= s.size() + e.size() && t.compare(0, s.size(), s) == 0 &&
           t.compare(t.size() - e.size(), e.size(), e) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || ends("<|", "|>") ||
         ends("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || ends("<unused", ">");
}

std::optional<int64_t> added_id(const Json& tj, const Json& name) {
  if (!name.is_string()) return std::nullopt;
  for (const Json& a : tj["added_tokens"]) {
    if (a["content"] == name) return a["id"].get<int64_t>();
  }
  return std::nullopt;
}

// Qwen3 as convert_hf_to_gguf writes it: byte-level BPE padded to config.json's 151,936 rows with
// "[PADn]" unused tokens; added tokens raw, control when special or special-looking.
GgufVocab qwen3_gguf(const fs::path& dir) {
  Json tj = read_json(dir / "tokenizer.json"), cfg = read_json(dir / "tokenizer_config.json");
  constexpr size_t kRows = 151936;
  GgufVocab v;
  v.source = "qwen3 as GGUF";
  v.model = "gpt2";
  v.pre = "qwen2";
  v.tokens.assign(kRows, "");
  v.token_types = std::vector<int32_t>(kRows, kUnused);
  for (const auto& [text, id] : tj["model"]["vocab"].items()) {
    v.tokens[id.get<size_t>()] = text;
    (*v.token_types)[id.get<size_t>()] = kNormal;
  }
  for (const Json& a : tj["added_tokens"]) {
    auto id = a["id"].get<size_t>();
    v.tokens[id] = a["content"].get<std::string>();
    (*v.token_types)[id] = a["special"].get<bool>() || looks_special(v.tokens[id]) ? kControl : kUserDefined;
  }
  for (size_t i = 0; i < kRows; ++i) {
    if ((*v.token_types)[i] == kUnused) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  v.merges.emplace();
  for (const Json& m : tj["model"]["merges"]) {
    v.merges->push_back(m.is_string() ? m.get<std::string>()
                                      : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  v.bos_id = added_id(tj, cfg["bos_token"]);
  v.eos_id = added_id(tj, cfg["eos_token"]);
  v.pad_id = added_id(tj, cfg["pad_token"]);
  v.add_bos = cfg["add_bos_token"].get<bool>();
  v.chat_template = cfg["chat_template"].get<std::string>();
  return v;
}

// Llama-2 as the SentencePiece converter writes it. tokenizer.model is not shared, so the piece
// scores are rebuilt from the merges that `tokenizers` derived from them: a piece scores minus
// the rank of its first merge (the merges list is in score order, one run per piece).
GgufVocab llama2_gguf(const fs::path& dir) {
  Json tj = read_json(dir / "tokenizer.json");
  const Json& vocab = tj["model"]["vocab"];
  GgufVocab v;
  v.source = "llama2 as GGUF";
  v.model = "llama";
  v.tokens.assign(vocab.size(), "");
  v.token_types = std::vector<int32_t>(vocab.size(), kNormal);
  v.scores = std::vector<float>(vocab.size(), 0.0f);
  for (const auto& [text, id] : vocab.items()) {
    auto i = id.get<size_t>();
    v.tokens[i] = text;
    if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') (*v.token_types)[i] = kByte;
  }
  (*v.token_types)[0] = kUnknown;  // <unk>
  (*v.token_types)[1] = kControl;  // <s>
  (*v.token_types)[2] = kControl;  // </s>
  std::vector<bool> scored(vocab.size(), false);
  const Json& merges = tj["model"]["merges"];
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string m = merges[r].get<std::string>();
    std::string merged = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
    auto id = vocab.at(merged).get<size_t>();
    if (!scored[id]) (*v.scores)[id] = -static_cast<float>(r);
    scored[id] = true;
  }
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  return v;
}

// GPT-2 ships encoder.json + vocab.bpe: the GGUF the converter writes, and the tokenizer.json that
// `tokenizers` builds from the same files (ByteLevel without prefix space, <|endoftext|> special).
GgufVocab gpt2_gguf(const fs::path& dir, Json* tokenizer_json) {
  Json enc = read_json(dir / "encoder.json");
  std::vector<std::string> merges;
  std::ifstream in(dir / "vocab.bpe");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  }
  GgufVocab v;
  v.source = "gpt2 as GGUF";
  v.model = "gpt2";
  v.pre = "gpt-2";
  v.tokens.assign(enc.size(), "");
  v.token_types = std::vector<int32_t>(enc.size(), kNormal);
  for (const auto& [text, id] : enc.items()) v.tokens[id.get<size_t>()] = text;
  (*v.token_types)[50256] = kControl;
  v.merges = merges;
  v.bos_id = v.eos_id = 50256;
  *tokenizer_json = {
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", enc}, {"merges", merges}}}};
  return v;
}

// Varied text in NFC form (Qwen3's tokenizer.json normalises to NFC; llama.cpp does not, so only
// NFC text can agree), then seeded random mixtures of it and of code points from many scripts.
std::vector<std::string> corpus(const std::vector<std::string>& specials) {
  std::vector<std::string> texts = {
      "Hello world", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n",
      "multiple\n\n\nnewlines and \n \n mixed", "digits 1234567890 and 3.14159, 1,000,000 or 42nd",
      "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m \xC3\xBF \xC3\xBE \xC3\x9F",
      "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD0\xB8 \xD0\xBA\xD0\xB8\xD1\x80\xD0\xB8\xD0\xBB\xD0\xBB\xD0\xB8\xD1\x86\xD0\xB0",
      "\xE4\xB8\xAD\xE6\x96\x87\xE6\xB5\x8B\xE8\xAF\x95\xEF\xBC\x9A\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "code: for (int i = 0; i < n; ++i) { x += y[i]; }  // done",
      "https://example.com/path?q=1&r=2#frag", "'s 't 're 've 'm 'll 'd I'M YOU'RE it's",
      "    indented\n        more\n\tand tab", "a  b   c    d     e", "", " ", "\n", "  \n\n  ",
      "math \xE2\x88\x91\xE2\x88\xAB\xE2\x88\x9A\xE2\x88\x9E\xE2\x89\xA0\xE2\x89\xA4 x\xC2\xB2",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85",
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 \xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5",
      "zero\xE2\x80\x8Bwidth and\xC2\xA0nbsp", "UPPER lower MiXeD CamelCaseWords snake_case",
      "!!! ??? ... --- *** ((()))", "\xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\xA3 full width",
  };
  for (const std::string& s : specials) {
    texts.push_back(s + "Hi there" + s + "\n" + s);
    texts.push_back("before" + s + " after  " + s + s + "end");
  }
  std::mt19937 rng(1234);
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0xA1, 0xFF}, {0x391, 0x3C9}, {0x410, 0x44F},
      {0x4E00, 0x9FA5}, {0x3041, 0x3096}, {0xAC00, 0xD7A3}, {0x1F600, 0x1F64F}, {0x2200, 0x22FF}};
  const std::string spaces[] = {" ", "  ", "\n", "\t", " \n ", "   "};
  size_t base = texts.size();
  for (int k = 0; k < 400; ++k) {
    std::string s;
    int parts = 1 + static_cast<int>(rng() % 6);
    for (int p = 0; p < parts; ++p) {
      switch (rng() % 4) {
        case 0: s += texts[rng() % base]; break;
        case 1: s += spaces[rng() % 6]; break;
        case 2: if (!specials.empty()) s += specials[rng() % specials.size()]; break;
        default: {
          auto [lo, hi] = ranges[rng() % ranges.size()];
          for (int c = 0, len = 1 + static_cast<int>(rng() % 8); c < len; ++c) {
            tok::append_utf8(s, lo + static_cast<char32_t>(rng() % (hi - lo + 1)));
          }
        }
      }
    }
    texts.push_back(s);
  }
  return texts;
}

void expect_same(const Tokenizer& ref, const Tokenizer& gguf, const std::vector<std::string>& texts) {
  int failures = 0;
  for (const std::string& t : texts) {
    for (bool add_special : {true, false}) {
      Ids want = ref.encode(t, add_special), got = gguf.encode(t, add_special);
      EXPECT_EQ(got, want) << "text: \"" << t << "\" add_special=" << add_special;
      if (got != want && ++failures > 5) return;
      for (bool skip : {false, true}) EXPECT_EQ(gguf.decode(want, skip), ref.decode(want, skip)) << t;
    }
  }
}

TEST(GgufRealVocab, Qwen3MatchesTokenizerJson) {
  fs::path dir = shared_tokenizers() / "qwen3";
  if (!fs::exists(dir / "tokenizer.json")) MOESTREAM_SKIP_OR_FAIL() << dir << " absent: real tokenizer files not available";
  Tokenizer ref = Tokenizer::load(dir / "tokenizer.json");
  Tokenizer gguf = Tokenizer::from_gguf(qwen3_gguf(dir));
  EXPECT_EQ(gguf.vocab_size(), 151936);
  EXPECT_EQ(gguf.eos_id(), 151645);
  EXPECT_EQ(gguf.bos_id(), std::nullopt);
  EXPECT_EQ(gguf.chat_template(), ref.chat_template());
  EXPECT_EQ(gguf.encode("<|im_start|>user\n\xE4\xBD\xA0\xE5\xA5\xBD<|im_end|>"),
            (Ids{151644, 872, 198, 108386, 151645}));
  EXPECT_TRUE(gguf.is_special(151645));
  EXPECT_FALSE(gguf.is_special(151667));  // <think>: user-defined
  EXPECT_EQ(gguf.token_id("[PAD151700]"), std::nullopt);
  expect_same(ref, gguf, corpus({"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"}));
  std::string text = "round \xF0\x9F\x98\x80 trip\n\n  \xE4\xB8\xAD";
  EXPECT_EQ(gguf.decode(gguf.encode(text)), text);
  // llama.cpp does not apply tokenizer.json's NFC normalizer: decomposed text keeps its bytes.
  std::string nfd = "cafe\xCC\x81";
  EXPECT_NE(gguf.encode(nfd), ref.encode(nfd));
  EXPECT_EQ(gguf.decode(gguf.encode(nfd)), nfd);
}

TEST(GgufRealVocab, Llama2MatchesTokenizerJson) {
  fs::path dir = shared_tokenizers() / "llama2";
  if (!fs::exists(dir / "tokenizer.json")) MOESTREAM_SKIP_OR_FAIL() << dir << " absent: real tokenizer files not available";
  Tokenizer ref = Tokenizer::load(dir / "tokenizer.json");
  Tokenizer gguf = Tokenizer::from_gguf(llama2_gguf(dir));
  EXPECT_EQ(gguf.encode("Hello world"), (Ids{1, 22557, 1526}));
  EXPECT_EQ(gguf.bos_id(), 1);
  EXPECT_EQ(gguf.eos_id(), 2);
  expect_same(ref, gguf, corpus({"<s>", "</s>", "<unk>"}));
}

TEST(GgufRealVocab, Gpt2MatchesTokenizerJson) {
  fs::path dir = shared_tokenizers() / "gpt2";
  if (!fs::exists(dir / "encoder.json")) MOESTREAM_SKIP_OR_FAIL() << dir << " absent: real tokenizer files not available";
  Json tj;
  GgufVocab v = gpt2_gguf(dir, &tj);
  TempDir tmp("gguf_vocab_test");
  std::ofstream(tmp.path() / "tokenizer.json") << tj.dump();
  Tokenizer ref = Tokenizer::load(tmp.path() / "tokenizer.json");
  Tokenizer gguf = Tokenizer::from_gguf(v);
  EXPECT_EQ(gguf.encode("Hello world"), (Ids{15496, 995}));
  expect_same(ref, gguf, corpus({"<|endoftext|>"}));
}

// --- hand-built vocabularies ---

// A byte-level vocabulary: the 256 byte chars, then "12", "123", "1234", with merges building them.
GgufVocab digits_vocab(std::optional<std::string> pre) {
  GgufVocab v;
  v.source = "digits.gguf";
  v.model = "gpt2";
  v.pre = std::move(pre);
  const tok::ByteLevelMap& m = tok::byte_level_map();
  for (int b = 0; b < 256; ++b) v.tokens.push_back(m.byte_to_utf8[b]);
  v.tokens.insert(v.tokens.end(), {"12", "123", "1234"});
  v.merges = std::vector<std::string>{"1 2", "12 3", "123 4"};
  v.add_bos = false;  // the llama-3 family would add one by default
  return v;
}

TEST(GgufVocabPre, DigitGroupingFollowsThePreTokenizer) {
  auto ids = [](const char* pre) { return Tokenizer::from_gguf(digits_vocab(pre)).encode("1234"); };
  EXPECT_EQ(ids("gpt-2"), (Ids{258}));                 // \p{N}+: one word
  EXPECT_EQ(ids("olmo"), (Ids{258}));
  EXPECT_EQ(ids("qwen2"), (Ids{'1', '2', '3', '4'}));  // \p{N}: one digit per word
  EXPECT_EQ(ids("llama-bpe"), (Ids{257, '4'}));        // \p{N}{1,3}
  EXPECT_EQ(ids("glm4"), (Ids{257, '4'}));
  EXPECT_EQ(ids("gpt-4o"), (Ids{257, '4'}));
  EXPECT_EQ(ids("deepseek-v3"), (Ids{257, '4'}));
  EXPECT_EQ(Tokenizer::from_gguf(digits_vocab(std::nullopt)).encode("1234"), (Ids{257, '4'}));  // default
}

TEST(GgufVocabPre, EveryNamedPreTokenizerRoundTrips) {
  const std::string text = "Hello, World! it's 2024\n\n  \xE4\xB8\xAD\xE6\x96\x87 \xE3\x81\x8B\xE3\x81\xAA caf\xC3\xA9 \xF0\x9F\x98\x80";
  for (const std::string& name : gguf_pre_tokenizer_names()) {
    Tokenizer t = Tokenizer::from_gguf(digits_vocab(name));
    EXPECT_EQ(t.decode(t.encode(text)), text) << name;
  }
}

TEST(GgufVocabPre, LlamaBpeSkipsMergesForWholeTokensAndAddsBos) {
  GgufVocab v = digits_vocab("llama-bpe");
  v.tokens.push_back("<|begin_of_text|>");
  v.token_types = std::vector<int32_t>(v.tokens.size(), kNormal);
  v.token_types->back() = kControl;
  v.tokens.push_back("ab");  // in the vocabulary but no merge builds it
  v.token_types->push_back(kNormal);
  v.bos_id = 259;
  v.add_bos.reset();
  Tokenizer t = Tokenizer::from_gguf(v);
  EXPECT_EQ(t.encode("ab"), (Ids{259, 260}));
  EXPECT_EQ(Tokenizer::from_gguf(digits_vocab("gpt-2")).encode("ab"), (Ids{'a', 'b'}));
}

TEST(GgufVocabPre, FirstOfARepeatedMergeWins) {
  GgufVocab v = digits_vocab("gpt-2");
  v.tokens.push_back("23");
  v.merges = std::vector<std::string>{"2 3", "1 2", "2 3"};  // "2 3" ranks 0, not 2
  EXPECT_EQ(Tokenizer::from_gguf(v).encode("123"), (Ids{'1', 259}));
}

// SentencePiece: <unk> <s> </s>, bytes, then pieces. "▁ab" must win over "bc" only by score.
GgufVocab spm_vocab() {
  GgufVocab v;
  v.source = "spm.gguf";
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = std::vector<int32_t>{kUnknown, kControl, kControl};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.token_types->push_back(kByte);
  }
  // ids 259.. : ▁ a b c ▁a ab bc ▁ab abc
  for (const char* t : {"\xE2\x96\x81", "a", "b", "c", "\xE2\x96\x81" "a", "ab", "bc", "\xE2\x96\x81" "ab", "abc"}) {
    v.tokens.push_back(t);
    v.token_types->push_back(kNormal);
  }
  v.scores = std::vector<float>(v.tokens.size(), 0.0f);
  (*v.scores)[263] = -1;  // ▁a
  (*v.scores)[264] = -3;  // ab
  (*v.scores)[265] = -2;  // bc
  (*v.scores)[266] = -4;  // ▁ab
  (*v.scores)[267] = -5;  // abc
  return v;
}

TEST(GgufVocabSpm, MergesByScoreWithByteFallbackAndSpacePrefix) {
  GgufVocab v = spm_vocab();
  Tokenizer t = Tokenizer::from_gguf(v);
  // "▁abc": ▁a (-1) first, then bc (-2): [▁a, bc]; "x" has no piece: bytes.
  EXPECT_EQ(t.encode("abc"), (Ids{1, 263, 265}));
  EXPECT_EQ(t.encode("abc x", false), (Ids{263, 265, 259, 3 + 'x'}));
  EXPECT_EQ(t.decode(t.encode("abc x")), "<s> abc x");  // only a leading prefix space is stripped
  EXPECT_EQ(t.decode(t.encode("abc x"), true), "abc x");
  // A special token in the text; the text after it gets its own prefix space.
  EXPECT_EQ(t.encode("a</s>b", false), (Ids{263, 2, 259, 261}));
  // Equal scores: the leftmost pair merges first (ab before bc), as llama.cpp does.
  GgufVocab tie = spm_vocab();
  (*tie.scores)[263] = -5;  // ▁a
  (*tie.scores)[264] = -1;  // ab
  (*tie.scores)[265] = -1;  // bc
  (*tie.scores)[266] = -2;  // ▁ab
  (*tie.scores)[267] = -3;  // abc
  EXPECT_EQ(Tokenizer::from_gguf(tie).encode("abc", false), (Ids{266, 262}));
  (*tie.scores)[264] = -1.5f;  // now bc first, then a+bc
  EXPECT_EQ(Tokenizer::from_gguf(tie).encode("abc", false), (Ids{259, 267}));
  v.add_space_prefix = false;
  v.add_bos = false;
  v.add_eos = true;
  Tokenizer np = Tokenizer::from_gguf(v);
  EXPECT_EQ(np.encode("abc"), (Ids{267, 2}));
  EXPECT_EQ(np.decode(np.encode(" abc")), " abc</s>");
}

TEST(GgufVocabSpm, DefaultsToLlamaCppSpecialIds) {
  Tokenizer t = Tokenizer::from_gguf(spm_vocab());
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_EQ(t.encode("<unk>", false), (Ids{0}));
}

// --- validation ---

template <typename E>
void expect_error(const GgufVocab& v, const std::string& needle) {
  try {
    Tokenizer::from_gguf(v);
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const E& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_NE(what.find(v.source), std::string::npos) << what;
  }
}

TEST(GgufVocabErrors, UnsupportedModelAndPreAreConfigErrors) {
  GgufVocab v = digits_vocab("gpt-2");
  v.model = "bert";
  expect_error<ConfigError>(v, "tokenizer.ggml.model: tokenizer model 'bert' is not supported");
  v.model = "";
  expect_error<FormatError>(v, "tokenizer.ggml.model: missing");
  expect_error<ConfigError>(digits_vocab("kimi-k2"), "tokenizer.ggml.pre: unknown pre-tokenizer 'kimi-k2' (supported: default, gpt-2");
  expect_error<ConfigError>(digits_vocab("deepseek-llm"), "tokenizer.ggml.pre");
}

TEST(GgufVocabErrors, ArraysMustAgree) {
  GgufVocab v = digits_vocab("gpt-2");
  v.token_types = std::vector<int32_t>(v.tokens.size() - 1, kNormal);
  expect_error<FormatError>(v, "tokenizer.ggml.token_type: has 258 entries but tokenizer.ggml.tokens has 259");
  v.token_types = std::vector<int32_t>(v.tokens.size(), kNormal);
  (*v.token_types)[7] = 9;
  expect_error<FormatError>(v, "tokenizer.ggml.token_type[7]: unknown token type 9");
  v = digits_vocab("gpt-2");
  v.scores = std::vector<float>(3, 0.0f);
  expect_error<FormatError>(v, "tokenizer.ggml.scores: has 3 entries");
  v = digits_vocab("gpt-2");
  v.tokens.clear();
  expect_error<FormatError>(v, "tokenizer.ggml.tokens: empty vocabulary");
  v = digits_vocab("gpt-2");
  v.tokens[5] = std::string(kGgufMaxTokenBytes + 1, 'x');
  expect_error<FormatError>(v, "tokenizer.ggml.tokens[5]: 1025 bytes exceed");
  v.tokens[5] = "ok\xE4\xBD";  // a truncated character
  expect_error<FormatError>(v, "tokenizer.ggml.tokens[5]: not valid UTF-8 at byte 2");
  GgufVocab s = spm_vocab();
  s.scores.reset();
  expect_error<FormatError>(s, "tokenizer.ggml.scores: missing");
  s = spm_vocab();
  (*s.scores)[260] = std::nanf("");
  expect_error<FormatError>(s, "tokenizer.ggml.scores[260]: not a finite number");
}

TEST(GgufVocabErrors, MergesMustReferToTokens) {
  GgufVocab v = digits_vocab("gpt-2");
  v.merges.reset();
  expect_error<FormatError>(v, "tokenizer.ggml.merges: missing");
  v.merges = std::vector<std::string>{"1 2", "12"};
  expect_error<FormatError>(v, "tokenizer.ggml.merges[1]: expected \"left right\"");
  v.merges = std::vector<std::string>{"1 2", "12 x3"};
  expect_error<FormatError>(v, "tokenizer.ggml.merges[1]: token 'x3' is not in tokenizer.ggml.tokens");
  v.merges = std::vector<std::string>{"2 3"};
  expect_error<FormatError>(v, "tokenizer.ggml.merges[0]: merged token '23' is not in");
}

TEST(GgufVocabErrors, SpecialIdsMustBeInRange) {
  GgufVocab v = digits_vocab("gpt-2");
  v.bos_id = 259;
  expect_error<FormatError>(v, "tokenizer.ggml.bos_token_id: id 259 is outside the vocabulary [0, 259)");
  v.bos_id = -1;
  expect_error<FormatError>(v, "tokenizer.ggml.bos_token_id: id -1");
  v.bos_id.reset();
  v.pad_id = int64_t{1} << 40;
  expect_error<FormatError>(v, "tokenizer.ggml.padding_token_id");
  v = digits_vocab("gpt-2");
  v.add_bos = true;
  expect_error<FormatError>(v, "tokenizer.ggml.add_bos_token: is set but there is no tokenizer.ggml.bos_token_id");
  v = digits_vocab("gpt-2");
  v.token_types = std::vector<int32_t>(v.tokens.size(), kNormal);
  (*v.token_types)[3] = kUnused;
  v.eos_id = 3;
  expect_error<FormatError>(v, "tokenizer.ggml.eos_token_id: id 3 names an unused or empty token");
  GgufVocab s = spm_vocab();
  s.unk_id = 600;
  expect_error<FormatError>(s, "tokenizer.ggml.unknown_token_id");
}

// Hostile metadata: random damage to every field either builds a tokenizer that then encodes and
// decodes without crashing, or fails with FormatError / ConfigError naming the file.
TEST(GgufVocabErrors, RandomDamageIsRefusedOrHarmless) {
  std::mt19937 rng(99);
  int built = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    GgufVocab v = round % 2 ? spm_vocab() : digits_vocab("qwen2");
    if (!v.token_types) v.token_types = std::vector<int32_t>(v.tokens.size(), kNormal);
    if (!v.scores) v.scores = std::vector<float>(v.tokens.size(), 0.0f);
    for (int d = 0, n = 1 + static_cast<int>(rng() % 4); d < n; ++d) {
      size_t i = rng() % v.tokens.size();  // case 7 makes tokens longer than the other arrays
      switch (rng() % 9) {
        case 0: v.tokens[i] = std::string(1, static_cast<char>(rng())); break;
        case 1: v.tokens[i].clear(); break;
        case 2: (*v.token_types)[i % v.token_types->size()] = static_cast<int32_t>(rng() % 8); break;
        case 3: (*v.scores)[i % v.scores->size()] = static_cast<float>(static_cast<int>(rng() % 7) - 3); break;
        case 4: v.bos_id = static_cast<int64_t>(rng() % (v.tokens.size() + 3)) - 1; break;
        case 5: v.eos_id = static_cast<int64_t>(rng() % (v.tokens.size() + 3)); v.add_eos = rng() % 2; break;
        case 6: v.unk_id = static_cast<int64_t>(rng() % (v.tokens.size() + 3)); break;
        case 7: v.tokens.push_back(v.tokens[i] + v.tokens[rng() % v.tokens.size()]); break;
        default:
          if (v.merges) (*v.merges)[rng() % v.merges->size()] = v.tokens[i] + " " + v.tokens[rng() % 300 % v.tokens.size()];
      }
    }
    try {
      Tokenizer t = Tokenizer::from_gguf(v);
      for (const char* text : {"abc 1234 x", "</s><s> a", "\xE4\xB8\xAD\xF0\x9F\x98\x80 \n"}) {
        Ids ids = t.encode(text);
        for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < t.vocab_size()) << id;
        (void)t.decode(ids);
        (void)t.decode(ids, true);
      }
      ++built;
    } catch (const Error& e) {
      EXPECT_TRUE(dynamic_cast<const FormatError*>(&e) || dynamic_cast<const ConfigError*>(&e)) << e.what();
      EXPECT_NE(std::string(e.what()).find(v.source), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(built, 300);
  EXPECT_GT(refused, 300);
}

}  // namespace
}  // namespace moestream
