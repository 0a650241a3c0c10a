// Tokenizer behaviour on small hand-built tokenizer.json files (merge order, added tokens, byte
// fallback, Metaspace, decoders, streaming) and on the real Qwen3 / Llama-2 files when present.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/support/strict_skip.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

// A byte-level BPE whose merge ranks are not left-to-right: "b c" outranks "a b".
const char* kByteLevelJson = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 11, "content": "<|x|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 12, "content": "<m>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": false},
    {"id": 4, "content": "bc", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "\u0120": 6, "\u0120a": 7,
                      "\u00c3": 8, "\u00a9": 9, "\u00c3\u00a9": 10},
            "merges": ["b c", "a b", "ab c", "\u0120 a", "\u00c3 \u00a9"]}
})";

// SentencePiece-style (Llama-2): Prepend/Replace normalizer, byte fallback, <s> template,
// Replace/ByteFallback/Fuse/Strip decoder. Byte tokens <0x00>..<0xFF> get ids 3..258.
std::string sentencepiece_json(bool byte_fallback) {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, R"(, "<0x%02X>": %d)", b, 3 + b);
    vocab += buf;
  }
  vocab += R"(, "\u2581": 259, "h": 260, "i": 261, "hi": 262, "\u2581hi": 263)";
  return std::string(R"({
  "added_tokens": [
    {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
            "byte_fallback": )") + (byte_fallback ? "true" : "false") + R"(,
            "vocab": {)" + vocab + R"(}, "merges": ["h i", "\u2581 hi"]}
})";
}

class TokenizerFiles : public ::testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir_.path() / name;
    write_file_atomic(p, text);
    return p;
  }
  TempDir dir_{"tokenizer_test"};
};

TEST_F(TokenizerFiles, MergesApplyByRankNotPosition) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", kByteLevelJson));
  EXPECT_EQ(tok.encode("abc"), (Ids{0, 4}));  // "b c" (rank 0) beats "a b" (rank 1)
  EXPECT_EQ(tok.encode("ab"), (Ids{3}));
  EXPECT_EQ(tok.encode(" abc"), (Ids{7, 4}));  // ByteLevel maps ' ' to U+0120
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{10}));  // é as the two byte chars, merged
  EXPECT_EQ(tok.decode(Ids{7, 4, 10}), " abc\xC3\xA9");
  EXPECT_EQ(tok.vocab_size(), 13);
}

TEST_F(TokenizerFiles, LeftmostPairWinsAmongEqualRanks) {
  std::string json = kByteLevelJson;
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", json));
  // "abab": both "a b" pairs have the same rank; each merges, then "ab c" does not apply.
  EXPECT_EQ(tok.encode("abab"), (Ids{3, 3}));
}

TEST_F(TokenizerFiles, AddedTokensAreMatchedBeforeSplitting) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", kByteLevelJson));
  EXPECT_EQ(tok.encode("ab<|x|>c"), (Ids{3, 11, 2}));
  EXPECT_EQ(tok.decode(Ids{3, 11, 2}), "ab<|x|>c");
  EXPECT_EQ(tok.decode(Ids{3, 11, 2}, /*skip_special_tokens=*/true), "abc");
  EXPECT_TRUE(tok.is_special(11));
  EXPECT_FALSE(tok.is_special(12));
}

TEST_F(TokenizerFiles, LstripRstripTokensSwallowSurroundingSpaces) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", kByteLevelJson));
  EXPECT_EQ(tok.encode("ab  <m>  c"), (Ids{3, 12, 2}));
}

TEST_F(TokenizerFiles, SingleWordTokenDoesNotMatchInsideAWord) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", kByteLevelJson));
  EXPECT_EQ(tok.encode("abc"), (Ids{0, 4}));      // "bc" follows a word char: BPE instead
  EXPECT_EQ(tok.encode("a bc"), (Ids{0, 6, 4}));  // a separate word: the added token (= vocab "bc")
}

TEST_F(TokenizerFiles, SentencePieceTemplateAndPrependPerSegment) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", sentencepiece_json(true)));
  EXPECT_EQ(tok.encode("hi hi"), (Ids{1, 263, 263}));
  EXPECT_EQ(tok.encode("hi hi", /*add_special_tokens=*/false), (Ids{263, 263}));
  // The normalizer runs on each stretch between added tokens, so "hi" after <s> gets a ▁ too.
  EXPECT_EQ(tok.encode("<s>hi"), (Ids{1, 1, 263}));
  EXPECT_EQ(tok.decode(Ids{1, 263, 263}, true), "hi hi");
}

TEST_F(TokenizerFiles, ByteFallbackEncodesUnknownCharsAsBytes) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", sentencepiece_json(true)));
  // é = C3 A9 -> <0xC3> <0xA9> = ids 3+0xC3, 3+0xA9.
  EXPECT_EQ(tok.encode("h\xC3\xA9"), (Ids{1, 259, 260, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.decode(Ids{1, 259, 260, 3 + 0xC3, 3 + 0xA9}, true), "h\xC3\xA9");
  // An invalid byte run decodes to one U+FFFD per byte, as the reference does.
  EXPECT_EQ(tok.decode(Ids{260, 3 + 0xC3, 3 + 0xC3}), "h\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(TokenizerFiles, UnknownCharsFuseIntoOneUnkWithoutByteFallback) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", sentencepiece_json(false)));
  EXPECT_EQ(tok.encode("h\xC3\xA9\xC3\xA9"), (Ids{1, 259, 260, 0}));
}

TEST_F(TokenizerFiles, MetaspaceFirstPrependsOnlyAtTheStartOfInput) {
  std::string json = sentencepiece_json(true);
  // Newer Mistral files: no normalizer, a Metaspace pre-tokenizer with prepend_scheme "first".
  json.replace(json.find("\"normalizer\""), json.find("\"pre_tokenizer\"") - json.find("\"normalizer\""),
               "\"normalizer\": null,\n  ");
  json.replace(json.find("\"pre_tokenizer\": null"), std::string("\"pre_tokenizer\": null").size(),
               R"("pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})");
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", json));
  EXPECT_EQ(tok.encode("hi", false), (Ids{263}));
  EXPECT_EQ(tok.encode("<s>hi", false), (Ids{1, 262}));
}

TEST_F(TokenizerFiles, StreamDecoderHoldsBackIncompleteCharacters) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", sentencepiece_json(true)));
  Ids ids = tok.encode("hi h\xC3\xA9 hi");
  StreamDecoder sd(tok, /*skip_special_tokens=*/true);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    if (id == 3 + 0xC3) EXPECT_EQ(piece, "") << "emitted half of é";
    if (id == 3 + 0xA9) EXPECT_EQ(piece, "\xC3\xA9");
    streamed += piece;
  }
  streamed += sd.flush();
  EXPECT_EQ(streamed, tok.decode(ids, true));
  EXPECT_EQ(streamed, "hi h\xC3\xA9 hi");
}

TEST_F(TokenizerFiles, StreamDecoderFlushReturnsPendingBytesAsReplacement) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", sentencepiece_json(true)));
  StreamDecoder sd(tok, true);
  EXPECT_EQ(sd.push(260), "h");
  EXPECT_EQ(sd.push(3 + 0xC3), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
}

TEST_F(TokenizerFiles, InvalidUtf8InputIsRejectedWithOffset) {
  Tokenizer tok = Tokenizer::load(write("tokenizer.json", kByteLevelJson));
  try {
    tok.encode(std::string("ab\xC3(", 4));
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerFiles, ConfigGivesBosEosAndChatTemplate) {
  fs::path tj = write("tokenizer.json", sentencepiece_json(true));
  write("tokenizer_config.json",
        R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": "{{ messages }}"})");
  Tokenizer tok = Tokenizer::load(tj);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.chat_template(), "{{ messages }}");
  EXPECT_EQ(tok.token_text(263), "\xE2\x96\x81hi");
  EXPECT_EQ(tok.token_id("<s>"), 1);
  EXPECT_THROW(tok.token_text(100000), ConfigError);
}

TEST_F(TokenizerFiles, LlamaConfigAddBosAndEosRebuildTheTemplate) {
  fs::path tj = write("tokenizer.json", sentencepiece_json(true));
  fs::path cfg = write("other_config.json",
                       R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                           "add_bos_token": false, "add_eos_token": true})");
  Tokenizer tok = Tokenizer::load(tj, cfg);
  EXPECT_EQ(tok.encode("hi"), (Ids{263, 2}));
}

TEST_F(TokenizerFiles, ChatTemplateJinjaBesideIsUsedWhenConfigHasNone) {
  fs::path tj = write("tokenizer.json", kByteLevelJson);
  write("chat_template.jinja", "{% for m in messages %}{{ m }}{% endfor %}");
  EXPECT_EQ(Tokenizer::load(tj).chat_template(), "{% for m in messages %}{{ m }}{% endfor %}");
  EXPECT_EQ(Tokenizer::load(tj).bos_id(), std::nullopt);
}

// Loading `json` must throw E whose message names the file and contains `needle`.
template <typename E>
void expect_load_error(const fs::path& path, const std::string& needle) {
  try {
    Tokenizer::load(path);
    FAIL() << "expected an error mentioning " << needle;
  } catch (const E& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

// kByteLevelJson with its first `from` replaced by `to`.
std::string byte_level_with(std::string_view from, std::string_view to) {
  std::string j = kByteLevelJson;
  return j.replace(j.find(from), from.size(), to);
}

TEST_F(TokenizerFiles, UnsupportedComponentsFailAtLoadNamingTheField) {
  const struct { const char *file, *from, *to, *field; } cases[] = {
      {"pre.json", R"("type": "ByteLevel")", R"("type": "Whitespace")", "pre_tokenizer.type"},
      {"model.json", R"("type": "BPE")", R"("type": "WordPiece")", "model.type"},
      {"norm.json", R"("type": "NFC")", R"("type": "BertNormalizer")", "normalizer.type"},
  };
  for (const auto& c : cases) expect_load_error<ConfigError>(write(c.file, byte_level_with(c.from, c.to)), c.field);
}

TEST_F(TokenizerFiles, MalformedFieldsFailAtLoadNamingTheField) {
  const std::string j = kByteLevelJson;
  expect_load_error<FormatError>(write("merges.json", byte_level_with(R"("b c")", R"("b z")")), "model.merges[0]");
  expect_load_error<FormatError>(write("id.json", byte_level_with(R"("a": 0)", R"("a": -4)")), "model.vocab");
  expect_load_error<FormatError>(write("trunc.json", j.substr(0, j.size() / 2)), "invalid JSON");
  std::string regex = R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": false},
                          "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})";
  expect_load_error<ConfigError>(write("regex.json", regex), "pre_tokenizer.pattern.Regex");
}

TEST_F(TokenizerFiles, AddedTokenIdCollidingWithAnotherVocabTokenIsRejected) {
  std::string j = kByteLevelJson;
  j.replace(j.find("{\"id\": 12, \"content\": \"<m>\""), 12, "{\"id\": 5, \"");
  expect_load_error<FormatError>(write("collide.json", j), "added_tokens[1].id");
}

TEST_F(TokenizerFiles, MissingFileIsAnIoError) {
  EXPECT_THROW(Tokenizer::load(dir_.path() / "absent.json"), IoError);
}

// The real vocabularies, when ../shared/tokenizers is present (ids checked against tokenizers).
fs::path shared_tokenizers() { return fs::path(MOESTREAM_SOURCE_DIR).parent_path() / "shared" / "tokenizers"; }

TEST(RealTokenizers, Qwen3KnownIdsAndConfig) {
  fs::path tj = shared_tokenizers() / "qwen3" / "tokenizer.json";
  if (!fs::exists(tj)) MOESTREAM_SKIP_OR_FAIL() << tj << " absent: real tokenizer files not available";
  Tokenizer tok = Tokenizer::load(tj);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{9707, 1879}));
  EXPECT_EQ(tok.encode("<|im_start|>user\n\xE4\xBD\xA0\xE5\xA5\xBD<|im_end|>"),
            (Ids{151644, 872, 198, 108386, 151645}));
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
}

// Ids from tokenizers 0.23.3. U+180E is not \\s for the reference (PCRE2's \\s says it is);
// U+13460 is a letter in Unicode 16 (PCRE2 10.42 knows 14); U+11D42 is a mark newer than the
// reference's Unicode 9.0 NFC data, so it is not reordered before U+FE28; U+0F39 is older, so it is.
TEST(RealTokenizers, Qwen3FollowsTheReferenceUnicodeVersions) {
  fs::path tj = shared_tokenizers() / "qwen3" / "tokenizer.json";
  if (!fs::exists(tj)) MOESTREAM_SKIP_OR_FAIL() << tj << " absent: real tokenizer files not available";
  Tokenizer tok = Tokenizer::load(tj);
  EXPECT_EQ(tok.encode(" \xE1\xA0\x8E>"), (Ids{86089, 254, 236, 29}));
  EXPECT_EQ(tok.encode("a\xF0\x93\x91\xA0" "a"), (Ids{64, 124373, 239, 254, 64}));
  EXPECT_EQ(tok.encode("\xEF\xB8\xA8\xF0\x91\xB5\x82"), (Ids{29237, 101, 128240, 113, 224}));
  EXPECT_EQ(tok.encode("q\xCC\x81\xE0\xBC\xB9"), (Ids{80, 91888, 117, 53839}));
}

TEST(RealTokenizers, ConcurrentEncodesMatchSequentialOnes) {
  fs::path tj = shared_tokenizers() / "qwen3" / "tokenizer.json";
  if (!fs::exists(tj)) MOESTREAM_SKIP_OR_FAIL() << tj << " absent: real tokenizer files not available";
  Tokenizer tok = Tokenizer::load(tj);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("doc " + std::to_string(i) + ": the quick brown fox \xE4\xBD\xA0\xE5\xA5\xBD " +
                    std::string(static_cast<size_t>(i % 7), ' ') + "jumps<|im_end|>" +
                    std::to_string(i * 7919) + " over the lazy dog\n");
  }
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t));
  // Threads share the word cache (one holds it, the others bypass it) and the regex.
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = t; i < texts.size(); i += 2) {
          if (tok.encode(texts[i]) != expected[i]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(RealTokenizers, Llama2KnownIdsAndConfig) {
  fs::path tj = shared_tokenizers() / "llama2" / "tokenizer.json";
  if (!fs::exists(tj)) MOESTREAM_SKIP_OR_FAIL() << tj << " absent: real tokenizer files not available";
  Tokenizer tok = Tokenizer::load(tj);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{1, 22557, 1526}));
  EXPECT_EQ(tok.encode("<s>Hello"), (Ids{1, 1, 22557}));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.decode(tok.encode("Hello world"), true), "Hello world");
}

}  // namespace
}  // namespace moestream
