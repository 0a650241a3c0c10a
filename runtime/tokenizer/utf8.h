// UTF-8 helpers for the tokenizer: validation, code point stepping, lossy repair as Rust's
// String::from_utf8_lossy does it, the GPT-2 byte<->char map, and the few Unicode classes needed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moestream::tok {

// Offset of the first byte that is not part of valid UTF-8, or npos when all is valid.
size_t find_invalid_utf8(std::string_view s);

// Length in bytes of the UTF-8 sequence starting with lead byte `b` (1 for invalid leads).
inline size_t utf8_len(unsigned char b) {
  return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
}

// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
// Decodes the code point that ends at s[end-1] (valid UTF-8 assumed); sets `start` to its start.
char32_t prev_code_point(std::string_view s, size_t end, size_t& start);

void append_utf8(std::string& out, char32_t cp);

// Appends `bytes` to out, each maximal invalid subsequence replaced by U+FFFD (Rust's rule).
void append_lossy(std::string& out, std::string_view bytes);

// Unicode White_Space (what `\s` means in the reference's regexes).
bool is_white_space(char32_t cp);
// Rust regex `\w`: alphabetic, marks, decimal digits, connector punctuation, join controls.
bool is_word_char(char32_t cp);

// GPT-2's reversible byte -> printable char map, as UTF-8 strings, and its inverse.
struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;
  std::array<char32_t, 256> byte_to_cp;
  // Inverse: code point -> byte, or -1. Only code points < 512 are ever produced.
  std::array<int16_t, 512> cp_to_byte;
};
const ByteLevelMap& byte_level_map();

}  // namespace moestream::tok
