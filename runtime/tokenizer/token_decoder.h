// tokenizer.json "decoder": turns vocabulary strings back into text. ByteLevel, Metaspace,
// ByteFallback, Fuse, Strip, Replace and Sequence, each a step over the token list as upstream.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/tokenizer/json_fields.h"
#include "runtime/tokenizer/tokenizer.h"  // VocabEncoding

namespace moestream::tok {

class TokenDecoder {
 public:
  virtual ~TokenDecoder() = default;
  // One step of the reference's decode_chain: tokens in, tokens out (joined by the caller).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // How this step turns vocabulary strings into bytes (the first step that does, for a Sequence).
  virtual VocabEncoding encoding() const { return VocabEncoding::kRaw; }
};

std::unique_ptr<TokenDecoder> make_token_decoder(const Json& j, const JsonFields& f,
                                                 const std::string& path);

}  // namespace moestream::tok
