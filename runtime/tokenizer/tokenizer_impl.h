// The state behind moestream::Tokenizer (pimpl): the pipeline read from tokenizer.json plus
// what tokenizer_config.json adds, or built from GGUF metadata. Shared by tokenizer.cpp
// (encode/decode), loader.cpp and gguf_vocab.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/added_vocab.h"
#include "runtime/tokenizer/bpe.h"
#include "runtime/tokenizer/normalizer.h"
#include "runtime/tokenizer/post_processor.h"
#include "runtime/tokenizer/pre_tokenizer.h"
#include "runtime/tokenizer/token_decoder.h"

namespace moestream {

struct Tokenizer::Impl {
  std::string source;  // tokenizer.json path, for messages
  std::unique_ptr<tok::Normalizer> normalizer;        // may be null
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;   // may be null
  std::unique_ptr<tok::BpeModel> model;
  tok::PostProcessor post_processor;
  std::unique_ptr<tok::TokenDecoder> decoder;         // null: tokens joined by " "

  std::vector<tok::AddedToken> added;                 // in file order
  std::unordered_map<int32_t, size_t> added_by_id;    // id -> index in `added`
  tok::StringIdMap added_by_content;
  tok::AddedTokenMatcher raw_matcher;                 // normalized == false
  tok::AddedTokenMatcher normalized_matcher;          // normalized == true

  int32_t vocab_size = 0;
  std::optional<int32_t> bos_id, eos_id;
  std::string chat_template;

  // Token string of `id` (added tokens first), or nullptr.
  const std::string* id_to_token(int32_t id) const {
    auto it = added_by_id.find(id);
    if (it != added_by_id.end()) return &added[it->second].content;
    return model->id_to_token(id);
  }
  // Builds raw_matcher / normalized_matcher from `added` (which must not change afterwards).
  void build_added_matchers();
  std::optional<int32_t> token_to_id(std::string_view token) const {
    auto it = added_by_content.find(token);
    if (it != added_by_content.end()) return it->second;
    return model->token_to_id(token);
  }
};

}  // namespace moestream
