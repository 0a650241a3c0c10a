// Inside runtime/chat/reply_parser: the state machine interface each family implements and the
// helpers they share (held-back marker prefixes, trimmed segments, JSON arguments).
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/chat/reply_parser.h"

namespace moestream {

struct ReplyParser::Machine {
  virtual ~Machine() = default;
  virtual ReplyDelta feed(std::string_view text) = 0;
  virtual ReplyDelta finish() = 0;
  int n_calls = 0;
};

// A machine that buffers what it is fed and consumes it in steps: step() does one transition or
// one emission from buf_ into the delta, true while there may be more to do.
class BufferedReplyMachine : public ReplyParser::Machine {
 public:
  ReplyDelta feed(std::string_view text) final {
    buf_.append(text);
    ReplyDelta d;
    while (step(d)) {
    }
    return d;
  }

 protected:
  virtual bool step(ReplyDelta& d) = 0;
  std::string buf_;
};

namespace reply {

// Length of the longest tail of `buf` that is a proper prefix of one of `markers`: text that
// must wait for the next piece before it can be shown.
size_t marker_prefix_tail(std::string_view buf, std::initializer_list<std::string_view> markers);

// The earliest of `markers` in `buf`: its position and which one (npos, -1 when none).
struct Found {
  size_t pos = std::string_view::npos;
  int which = -1;
};
Found find_first(std::string_view buf, std::initializer_list<std::string_view> markers);

// One segment of reasoning or content, without the whitespace around it: leading whitespace is
// dropped, trailing whitespace held until more text follows (dropped if the segment ends).
class Trimmed {
 public:
  void restart() {
    started_ = false;
    ws_.clear();
  }
  std::string push(std::string_view s);

 private:
  bool started_ = false;
  std::string ws_;
};

// `text` as compact JSON text when it is a JSON object, else nullopt.
std::optional<std::string> json_object_text(std::string_view text);

std::string_view trim(std::string_view s);

std::unique_ptr<ReplyParser::Machine> harmony_machine(const ReplyParserOptions& opts);

}  // namespace reply
}  // namespace moestream
