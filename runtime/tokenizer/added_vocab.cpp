// Added-token matching: a byte trie scanned leftmost-longest (the reference uses Aho-Corasick with
// the same match kind), then the single_word / lstrip / rstrip adjustments of the reference.
#include "runtime/tokenizer/added_vocab.h"

#include <algorithm>

#include "runtime/tokenizer/utf8.h"

namespace moestream::tok {

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens,
                              const std::vector<std::string>& patterns) {
  nodes_.assign(1, Node{});
  tokens_.clear();
  first_byte_.fill(false);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& pat = patterns[t];
    if (pat.empty()) continue;
    int32_t node = 0;
    for (unsigned char b : pat) {
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& ch = nodes_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, int32_t{-1})),
                  std::make_pair(b, c));
      }
      node = c;
    }
    // The first token with a given pattern wins, as Aho-Corasick reports the lowest pattern index.
    if (nodes_[node].token < 0) {
      nodes_[node].token = static_cast<int32_t>(tokens_.size());
      tokens_.push_back(tokens[t]);
    }
    first_byte_[static_cast<unsigned char>(pat[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  for (const auto& [byte, c] : nodes_[node].children) {
    if (byte == b) return c;
    if (byte > b) break;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t n = text.size();
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;
  auto emit = [&](size_t a, size_t b, int32_t id) {
    if (b > a || id >= 0) out.push_back(Segment{text.substr(a, b - a), id, a});
  };
  while (pos < n && !tokens_.empty()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest token starting at pos.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = pos; k < n; ++k) {
      node = child(node, static_cast<unsigned char>(text[k]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = *tokens_[best];
    size_t start = pos, stop = best_end;
    pos = best_end;  // matches never overlap, even a discarded one
    if (tok.single_word) {
      bool start_space = true, stop_space = true;
      if (start > 0) {
        size_t s;
        start_space = !is_word_char(prev_code_point(text, start, s));
      }
      if (stop < n) {
        size_t k = stop;
        stop_space = !is_word_char(next_code_point(text, k));
      }
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t cs;
        if (!is_white_space(prev_code_point(text, s, cs))) break;
        s = cs;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < n) {
        size_t k = stop;
        if (!is_white_space(next_code_point(text, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) emit(start_offset, start, -1);
    emit(start, stop, tok.id);
    start_offset = stop;
  }
  if (start_offset < n) emit(start_offset, n, -1);
}

}  // namespace moestream::tok
