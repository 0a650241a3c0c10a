// Random corruption of tokenizer.json (truncation, byte flips, spliced garbage): loading must
// either succeed or throw FormatError/ConfigError naming the file, never crash or throw
// anything else; a tokenizer that does load must still encode and decode without crashing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "common/error.h"
#include "common/file_util.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/support/strict_skip.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;

// Small but exercising every component kind the loader reads.
const char* kSmallJson = R"({"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [{"id": 12, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                  {"id": 13, "content": "<m>", "single_word": true, "lstrip": true, "rstrip": true, "normalized": true, "special": false}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s{3,}"}, "content": "  "}]},
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
   {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
   {"type": "Digits", "individual_digits": true},
   {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
 "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
   "pair": [], "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [12], "tokens": ["<|end|>"]}}},
 "decoder": {"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
   "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
   "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "\u0120": 6, "\u0120a": 7, "1": 8, "2": 9, "'": 10, "s": 11},
   "merges": ["b c", "a b", "ab c", "\u0120 a"]}})";

// Plain write: thousands of mutants, no need for write_file_atomic's fsyncs.
void write_plain(const fs::path& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(f.good()) << p;
}

const char* kSample = "abc ab 12 'S \xC3\xA9 <|end|> <m> \xE4\xBD\xA0 \n\n   x";

// Loads `path`; returns false when it was rejected with a typed, file-naming error.
bool load_or_typed_error(const fs::path& path) {
  try {
    Tokenizer tok = Tokenizer::load(path);
    std::vector<int32_t> ids = tok.encode(kSample);
    ids.push_back(tok.vocab_size() + 5);  // an unknown id must be skipped, not crash
    ids.push_back(-3);
    std::string text = tok.decode(ids, false);
    StreamDecoder sd(tok);
    for (int32_t id : ids) text += sd.push(id);
    text += sd.flush();
    return true;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos) << e.what();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos) << e.what();
  }
  return false;
}

// Applies one random corruption to `s`.
std::string corrupt(const std::string& s, std::mt19937_64& rng, int kind) {
  std::string out = s;
  std::uniform_int_distribution<size_t> pos(0, s.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  switch (kind) {
    case 0:  // truncation
      out.resize(pos(rng));
      break;
    case 1: {  // 1-8 random byte flips
      int n = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < n; ++i) out[pos(rng)] = static_cast<char>(byte(rng));
      break;
    }
    case 2: {  // a structural character replaced by another
      static const char kStruct[] = "{}[]\":,0-9 tfn\\";
      int n = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < n; ++i) out[pos(rng)] = kStruct[rng() % (sizeof kStruct - 1)];
      break;
    }
    default: {  // a span duplicated elsewhere (keeps valid-looking JSON fragments)
      size_t a = pos(rng), len = std::min<size_t>(1 + rng() % 40, s.size() - a);
      out.insert(pos(rng), s.substr(a, len));
      break;
    }
  }
  return out;
}

TEST(TokenizerCorruption, SmallJsonMutationsLoadOrFailWithTypedError) {
  TempDir dir("tok_corrupt");
  fs::path good = dir.path() / "tokenizer.json";
  write_file_atomic(good, kSmallJson);
  ASSERT_TRUE(load_or_typed_error(good)) << "the uncorrupted file must load";
  std::mt19937_64 rng(20261129);
  int loaded = 0, rejected = 0;
  // MOESTREAM_FUZZ_ITERATIONS raises the count for a longer local (sanitizer) run.
  const char* env = std::getenv("MOESTREAM_FUZZ_ITERATIONS");
  int iterations = env ? std::max(4, std::atoi(env)) : 3000;
  for (int i = 0; i < iterations; ++i) {
    int kind = i % 4;
    fs::path p = dir.path() / "mutant.json";
    write_plain(p, corrupt(kSmallJson, rng, kind));
    if (load_or_typed_error(p)) ++loaded; else ++rejected;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(rejected, iterations / 4);  // truncations alone are a quarter, always rejected
  std::printf("small json: %d mutants loaded, %d rejected\n", loaded, rejected);
}

TEST(TokenizerCorruption, TruncationIsAlwaysRejected) {
  TempDir dir("tok_trunc");
  std::string s = kSmallJson;
  for (size_t len = 0; len < s.size(); len += 7) {
    fs::path p = dir.path() / "truncated.json";
    write_plain(p, s.substr(0, len));
    EXPECT_THROW(Tokenizer::load(p), FormatError) << "length " << len;
  }
}

TEST(TokenizerCorruption, RealFilesMutationsLoadOrFailWithTypedError) {
  fs::path shared = fs::path(MOESTREAM_SOURCE_DIR).parent_path() / "shared" / "tokenizers";
  fs::path llama = shared / "llama2" / "tokenizer.json";
  if (!fs::exists(llama)) MOESTREAM_SKIP_OR_FAIL() << llama << " absent: real tokenizer files not available";
  TempDir dir("tok_corrupt_real");
  std::string s = read_file(llama);
  std::mt19937_64 rng(7);
  // Few iterations: each load parses 1.8 MB. Truncation is always an error; the others may load.
  for (int i = 0; i < 12; ++i) {
    fs::path p = dir.path() / "tokenizer.json";
    write_plain(p, corrupt(s, rng, i % 4));
    bool ok = load_or_typed_error(p);
    if (i % 4 == 0) EXPECT_FALSE(ok) << "a truncated file loaded";
  }
}

}  // namespace
}  // namespace moestream
