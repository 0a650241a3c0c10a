// Stop strings over streamed text: releases text as soon as it cannot be the start of a stop
// string, and cuts the output at the first stop string (which is not returned, as OpenAI does).
#pragma once

#include <string>
#include <vector>

namespace moestream {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds generated text; returns what may be shown now. After a stop string, stopped() is true
  // and later text is ignored.
  std::string feed(const std::string& text);
  // The text held back at the end of generation.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string the output was cut at ("" before).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace moestream
