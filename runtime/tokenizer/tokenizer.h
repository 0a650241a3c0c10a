// Hugging Face tokenizer.json in plain C++: byte-level BPE (GPT-2, Qwen2/3) and SentencePiece-style
// BPE (Llama-2, Mistral, Mixtral), id-for-id with the `tokenizers` library; no Python at run time.
//
// Supported tokenizer.json components (anything else fails at load with ConfigError naming the field):
//   model:          BPE (vocab, merges as "a b" or ["a","b"], unk_token, fuse_unk, byte_fallback,
//                   continuing_subword_prefix, end_of_word_suffix, ignore_merges; dropout null/0)
//   normalizer:     NFC, NFD, NFKC, NFKD, Prepend, Replace (String or Regex), Sequence
//   pre_tokenizer:  Split (String/Regex, all behaviours, invert), ByteLevel, Metaspace, Digits,
//                   Sequence
//   post_processor: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence
//   decoder:        ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence
//   added_tokens:   matched before normalisation (normalized=false) or after it (normalized=true),
//                   leftmost-longest, with single_word / lstrip / rstrip
// `truncation` and `padding` are ignored: moestream always wants every id of the input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moestream {

struct GgufVocab;  // runtime/tokenizer/gguf_vocab.h

// How the decoder turns vocabulary strings (token_text) into bytes, for code that needs each
// token's bytes on its own (constrained decoding): kByteLevel maps each char to a byte (GPT-2's
// table), kMetaspace turns U+2581 into a space and "<0xNN>" into byte NN (SentencePiece with byte
// fallback), kRaw takes the string as it is.
enum class VocabEncoding { kRaw, kByteLevel, kMetaspace };

class Tokenizer {
 public:
  // Reads tokenizer.json (and tokenizer_config.json: bos/eos, add_bos/add_eos, chat template).
  // tokenizer_config empty: use tokenizer_config.json beside tokenizer.json when present.
  // Throws IoError (unreadable), FormatError (malformed JSON or field), ConfigError (unsupported
  // component); each message names the file and the field.
  static Tokenizer load(const std::filesystem::path& tokenizer_json,
                        const std::filesystem::path& tokenizer_config = {});

  // Builds the tokenizer that a GGUF file's tokenizer.ggml.* metadata describes, tokenizing as
  // llama.cpp does for that model kind (see gguf_vocab.h). Throws FormatError (inconsistent or
  // out-of-range metadata) or ConfigError (unsupported model or pre-tokenizer), naming the key.
  static Tokenizer from_gguf(const GgufVocab& vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text must be valid UTF-8 (FormatError naming the byte offset otherwise). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped, as the reference does. Thread-safe.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const std::string& chat_template() const;  // "" when none
  // The vocabulary string of `id` (e.g. "Ġhello", "▁the", "<|im_end|>"); ConfigError when unknown.
  std::string token_text(int32_t id) const;
  // The id of a vocabulary or added-token string, when there is one.
  std::optional<int32_t> token_id(std::string_view token) const;
  // True for added tokens marked "special" (skipped by decode(..., skip_special_tokens=true)).
  bool is_special(int32_t id) const;
  // The decoder's VocabEncoding (kRaw without a decoder).
  VocabEncoding vocab_encoding() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamDecoder;
};

// Incremental decoding for streaming: push ids, get text that never ends inside a UTF-8 char.
// Follows the reference's DecodeStream: text is released once decode(window) grows and does not
// end in U+FFFD, so decoders that look at neighbours (Strip, Metaspace) stay exact.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  // New text made complete by `id` ("" while a character is still incomplete).
  std::string push(int32_t id);
  // Whatever is still held back (incomplete bytes come out as U+FFFD); resets the stream.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace moestream
