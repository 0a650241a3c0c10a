// Implementation of runtime/server/stop_matcher.h.
#include "runtime/server/stop_matcher.h"

#include <algorithm>

namespace moestream {

std::string StopMatcher::feed(const std::string& text) {
  if (stopped_) return "";
  pending_ += text;
  size_t cut = std::string::npos;
  for (const auto& s : stops_)
    if (const size_t at = pending_.find(s); at < cut) {
      cut = at;
      matched_ = s;
    }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? "" : out;
}

}  // namespace moestream
