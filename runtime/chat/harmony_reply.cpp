// gpt-oss's harmony replies for runtime/chat/reply_parser.h: a sequence of messages, each
// `[<|start|>assistant][ to=R]<|channel|>C[ to=R][ <|constrain|>json]<|message|>BODY<|end|>`.
// Channel analysis is reasoning, a message to functions.N a tool call (its body the arguments),
// final and commentary without a recipient are content. <|call|> and <|return|> end the reply.
#include <string>

#include "runtime/chat/reply_machine.h"

namespace moestream::reply {

namespace {
constexpr size_t npos = std::string_view::npos;
constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kEnd = "<|end|>", kCall = "<|call|>", kReturn = "<|return|>";

// The word after `key` in a header: up to whitespace or the next special token.
std::string word_after(std::string_view header, std::string_view key) {
  const size_t p = header.find(key);
  if (p == npos) return "";
  std::string_view rest = header.substr(p + key.size());
  size_t e = 0;
  while (e < rest.size() && rest[e] != ' ' && rest[e] != '\n' && rest.substr(e, 2) != "<|") ++e;
  return std::string(rest.substr(0, e));
}

class HarmonyMachine : public BufferedReplyMachine {
 public:
  explicit HarmonyMachine(ReplyParserOptions o) : o_(std::move(o)) {}

  ReplyDelta finish() override {
    ReplyDelta d;
    // A header cut off by the end holds only markup: it is dropped.
    if (state_ == State::kBody) end_body(buf_, d);
    else if (state_ == State::kBetween) out(d, Kind::kContent, buf_);
    buf_.clear();
    return d;
  }

 private:
  enum class State { kBetween, kHeader, kBody };
  enum class Kind { kContent, kReasoning, kCall };

  bool step(ReplyDelta& d) override {
    switch (state_) {
      case State::kBetween: {
        if (buf_.empty()) return false;
        for (std::string_view m : {kStart, kChannel}) {
          if (buf_.compare(0, m.size(), m) == 0) {
            state_ = State::kHeader;
            return true;
          }
          if (m.substr(0, buf_.size()) == buf_) return false;  // may still become a header
        }
        begin_body(Kind::kContent, "");  // a reply without headers: content
        return true;
      }
      case State::kHeader: {
        const size_t m = buf_.find(kMessage);
        if (m == npos) return false;
        const std::string header = buf_.substr(0, m);
        buf_.erase(0, m + kMessage.size());
        const std::string to = word_after(header, "to="), channel = word_after(header, kChannel);
        if (!to.empty() && o_.parse_tool_calls) begin_body(Kind::kCall, to);
        else begin_body(channel == "analysis" ? Kind::kReasoning : Kind::kContent, "");
        return true;
      }
      case State::kBody: {
        const Found f = find_first(buf_, {kEnd, kCall, kReturn, kStart});
        if (f.which >= 0) {
          const std::string body = buf_.substr(0, f.pos);
          // <|start|> opens the next message itself: it stays in the buffer.
          buf_.erase(0, f.pos + (f.which == 3 ? 0 : (f.which == 0 ? kEnd : f.which == 1 ? kCall : kReturn).size()));
          end_body(body, d);
          return true;
        }
        if (kind_ == Kind::kCall) return false;  // arguments come whole
        const size_t hold = marker_prefix_tail(buf_, {kEnd, kCall, kReturn, kStart});
        out(d, kind_, std::string_view(buf_).substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return false;
      }
    }
    return false;
  }

  void begin_body(Kind k, std::string recipient) {
    state_ = State::kBody;
    kind_ = k;
    recipient_ = std::move(recipient);
    seg_.restart();
  }

  // The end of a message's body (the call's whole arguments, or the rest of text).
  void end_body(std::string_view rest, ReplyDelta& d) {
    if (kind_ == Kind::kCall) {
      auto args = json_object_text(trim(rest));
      std::string name = recipient_;
      if (name.substr(0, 10) == "functions.") name.erase(0, 10);
      if (args && !name.empty()) d.calls.push_back({o_.id_prefix + std::to_string(n_calls++), name, *args});
      else out(d, Kind::kContent, rest);  // not a call we can read: its text is content
    } else {
      out(d, kind_, rest);
    }
    state_ = State::kBetween;
  }

  void out(ReplyDelta& d, Kind k, std::string_view s) {
    (k == Kind::kReasoning ? d.reasoning : d.content) += seg_.push(s);
  }

  ReplyParserOptions o_;
  State state_ = State::kBetween;
  Kind kind_ = Kind::kContent;
  std::string recipient_;
  Trimmed seg_;
};
}  // namespace

std::unique_ptr<ReplyParser::Machine> harmony_machine(const ReplyParserOptions& opts) {
  return std::make_unique<HarmonyMachine>(opts);
}

}  // namespace moestream::reply
