// Implementation of read_gguf_vocab / load_gguf_tokenizer (gguf_vocab.h): the tokenizer.ggml.*
// keys of a GGUF's metadata into a GgufVocab, with the reader's typed getters naming any key of
// the wrong type.
#include <string>

#include "loader/format/gguf_file.h"
#include "runtime/tokenizer/gguf_vocab.h"
#include "runtime/tokenizer/tokenizer.h"

namespace moestream {

GgufVocab read_gguf_vocab(const GgufMetadata& m) {
  GgufVocab v;
  v.source = m.source();
  v.model = m.get_string(kGgufKeyModel);
  if (const std::string* pre = m.find_string(kGgufKeyPre)) v.pre = *pre;
  v.tokens = m.get_string_array(kGgufKeyTokens);
  if (m.contains(kGgufKeyTokenType)) {
    std::vector<int32_t> types;
    for (int64_t t : m.get_i64_array(kGgufKeyTokenType)) {
      // Out-of-range values become 0, which from_gguf refuses naming the key.
      types.push_back(t >= INT32_MIN && t <= INT32_MAX ? int32_t(t) : 0);
    }
    v.token_types = std::move(types);
  }
  if (m.contains(kGgufKeyScores)) v.scores = m.get_f32_array(kGgufKeyScores);
  if (m.contains(kGgufKeyMerges)) v.merges = m.get_string_array(kGgufKeyMerges);
  v.bos_id = m.find_i64(kGgufKeyBosId);
  v.eos_id = m.find_i64(kGgufKeyEosId);
  v.unk_id = m.find_i64(kGgufKeyUnkId);
  v.pad_id = m.find_i64(kGgufKeyPadId);
  v.add_bos = m.find_bool(kGgufKeyAddBos);
  v.add_eos = m.find_bool(kGgufKeyAddEos);
  v.add_space_prefix = m.find_bool(kGgufKeyAddSpacePrefix);
  if (const std::string* t = m.find_string(kGgufKeyChatTemplate)) v.chat_template = *t;
  return v;
}

Tokenizer load_gguf_tokenizer(const std::filesystem::path& gguf) {
  // Metadata lives in the first shard of a split set; GgufModelFiles finds it from any shard.
  const GgufModelFiles files(gguf);
  return Tokenizer::from_gguf(read_gguf_vocab(files.metadata()));
}

}  // namespace moestream
