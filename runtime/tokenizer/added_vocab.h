// tokenizer.json "added_tokens": tokens matched in the text before BPE (special tokens such as
// <|im_end|>), leftmost-longest, honouring single_word / lstrip / rstrip.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moestream::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A text stretch between matches (id < 0) or one matched added token (id >= 0).
struct Segment {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // byte offset within the text given to split()
};

// Leftmost-longest matcher over a set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for (the normalised content for normalized tokens).
  void build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into segments covering it, in order (empty text gives no segment).
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                        // index into tokens_
  };
  int32_t child(int32_t node, unsigned char b) const;
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace moestream::tok
