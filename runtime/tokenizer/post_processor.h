// tokenizer.json "post_processor": wraps the ids of one sequence with special tokens when
// add_special_tokens is set (TemplateProcessing, Roberta/Bert; ByteLevel leaves ids alone).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tokenizer/json_fields.h"

namespace moestream::tok {

class PostProcessor {
 public:
  // Single-sequence template: ids before and after the sequence.
  std::vector<int32_t> prefix, suffix;
  void apply(std::vector<int32_t>& ids) const {
    ids.insert(ids.begin(), prefix.begin(), prefix.end());
    ids.insert(ids.end(), suffix.begin(), suffix.end());
  }
};

PostProcessor make_post_processor(const Json& j, const JsonFields& f, const std::string& path);

}  // namespace moestream::tok
