// StreamDecoder: the reference's DecodeStream prefix scheme, so streamed text equals decode() of
// the whole sequence and never stops inside a UTF-8 character.
#include "runtime/tokenizer/tokenizer.h"

#include <string_view>

namespace moestream {

namespace {
bool ends_with_replacement(std::string_view s) {
  return s.size() >= 3 && s.substr(s.size() - 3) == "\xEF\xBF\xBD";
}
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  if (prefix_.empty() && !ids_.empty()) {
    std::string p = tok_->decode(ids_, skip_special_);
    if (!ends_with_replacement(p)) {
      prefix_ = std::move(p);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  std::string text = tok_->decode(ids_, skip_special_);
  // Held back while the newest bytes are an incomplete character (decoded as U+FFFD).
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return {};
  std::string fresh;
  if (text.compare(0, prefix_.size(), prefix_) == 0) {
    fresh = text.substr(prefix_.size());
  } else {
    // A decoder rewrote earlier text (not seen with supported decoders): emit the whole window
    // rather than lose text.
    fresh = text;
  }
  size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tok_->decode(ids_, skip_special_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::flush() {
  std::string text = tok_->decode(ids_, skip_special_);
  std::string rest = text.compare(0, prefix_.size(), prefix_) == 0 ? text.substr(prefix_.size())
                                                                   : text;
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace moestream
