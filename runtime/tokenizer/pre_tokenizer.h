// tokenizer.json "pre_tokenizer": splits normalised text into words before BPE. Split (regex or
// literal), ByteLevel, Metaspace, Digits and Sequence, with the reference's split behaviours.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/json_fields.h"

namespace moestream::tok {

// One word in progress. `at_origin`: it starts at byte 0 of the original input (Metaspace's
// prepend_scheme "first" looks at this).
struct Piece {
  std::string_view text;
  bool at_origin = false;
};

// Owns the strings that transformed pieces point into for the duration of one encode call.
using PieceArena = std::deque<std::string>;

class ByteLevelPre;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their split (empty pieces are dropped, as the reference does).
  virtual void apply(std::vector<Piece>& pieces, PieceArena& arena) const = 0;
  // The ByteLevel step when it is the last step, so its byte->char mapping can be left to the
  // model (which then caches on raw bytes); nullptr otherwise.
  virtual ByteLevelPre* trailing_byte_level() { return nullptr; }
};

class ByteLevelPre : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex);
  ~ByteLevelPre() override;
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override;
  ByteLevelPre* trailing_byte_level() override { return this; }
  // Leave pieces as raw bytes; the model maps them (see BpeModel::set_byte_level_input).
  void defer_mapping() { map_bytes_ = false; }

 private:
  bool add_prefix_space_;
  bool map_bytes_ = true;
  std::unique_ptr<class Splitter> splitter_;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const JsonFields& f,
                                                 const std::string& path);

}  // namespace moestream::tok
