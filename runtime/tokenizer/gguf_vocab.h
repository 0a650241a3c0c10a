// A GGUF file's tokenizer metadata (the tokenizer.ggml.* keys that llama.cpp's converter writes) as
// plain data: the GGUF reader fills it, Tokenizer::from_gguf validates it and builds the tokenizer.
//
// Keys (all optional unless marked; arrays are indexed by token id):
//   tokenizer.ggml.model            string, required: "gpt2" (byte-level BPE with merges) or "llama"
//                                   (SentencePiece BPE: merges by score, <0xNN> byte fallback).
//                                   Any other model ("bert", "t5", "rwkv", ...) is a ConfigError.
//   tokenizer.ggml.pre              string, "gpt2" only: names the pre-tokenizer regexes (see
//                                   gguf_pre_tokenizer_names()); absent means "default", as in llama.cpp.
//   tokenizer.ggml.tokens           string[n], required; 1 <= n <= kGgufMaxTokens.
//   tokenizer.ggml.token_type       i32[n]: 1 normal, 2 unknown, 3 control, 4 user-defined,
//                                   5 unused, 6 byte (absent: all normal).
//   tokenizer.ggml.scores           f32[n], finite; required for "llama" (merge priority).
//   tokenizer.ggml.merges           string[], "left right" (split at the first space after the
//                                   first byte); required for "gpt2", ignored for "llama".
//   tokenizer.ggml.{bos,eos,unknown,padding}_token_id   u32 < n.
//   tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix   bool.
//   tokenizer.chat_template         string.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace moestream {

inline constexpr const char* kGgufKeyModel = "tokenizer.ggml.model";
inline constexpr const char* kGgufKeyPre = "tokenizer.ggml.pre";
inline constexpr const char* kGgufKeyTokens = "tokenizer.ggml.tokens";
inline constexpr const char* kGgufKeyTokenType = "tokenizer.ggml.token_type";
inline constexpr const char* kGgufKeyScores = "tokenizer.ggml.scores";
inline constexpr const char* kGgufKeyMerges = "tokenizer.ggml.merges";
inline constexpr const char* kGgufKeyBosId = "tokenizer.ggml.bos_token_id";
inline constexpr const char* kGgufKeyEosId = "tokenizer.ggml.eos_token_id";
inline constexpr const char* kGgufKeyUnkId = "tokenizer.ggml.unknown_token_id";
inline constexpr const char* kGgufKeyPadId = "tokenizer.ggml.padding_token_id";
inline constexpr const char* kGgufKeyAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr const char* kGgufKeyAddEos = "tokenizer.ggml.add_eos_token";
inline constexpr const char* kGgufKeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
inline constexpr const char* kGgufKeyChatTemplate = "tokenizer.chat_template";

// Bounds that real vocabularies stay far below (the largest ship ~256k tokens of < 300 bytes,
// a few MB in all, and < 1M merges); beyond them the metadata is corrupt, and the SentencePiece
// merge derivation (quadratic in a token's length) and merge table would grow without bound.
inline constexpr size_t kGgufMaxTokens = size_t{1} << 22;
inline constexpr size_t kGgufMaxTokenBytes = 1024;
inline constexpr size_t kGgufMaxTotalTokenBytes = size_t{32} << 20;
inline constexpr size_t kGgufMaxMerges = size_t{1} << 22;  // given (gpt2) or derived (llama)

// tokenizer.ggml.token_type values.
enum class GgufTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct GgufVocab {
  std::string source;  // the file, for error messages
  std::string model;
  std::optional<std::string> pre;
  std::vector<std::string> tokens;
  std::optional<std::vector<int32_t>> token_types;
  std::optional<std::vector<float>> scores;
  std::optional<std::vector<std::string>> merges;
  // Wide enough for any integer type a file may store, so range checks see the real value.
  std::optional<int64_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;
};

// The tokenizer.ggml.pre names accepted for "gpt2" vocabularies.
std::vector<std::string> gguf_pre_tokenizer_names();

class GgufMetadata;
class Tokenizer;
// The tokenizer keys of a GGUF's metadata (FormatError naming the key for a wrong type).
GgufVocab read_gguf_vocab(const GgufMetadata& metadata);
// The tokenizer of a GGUF file or split set (any shard): read_gguf_vocab, then Tokenizer::from_gguf.
Tokenizer load_gguf_tokenizer(const std::filesystem::path& gguf);

}  // namespace moestream
