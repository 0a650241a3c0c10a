// libFuzzer target: ReplyParser (runtime/chat/reply_parser.h). Byte 0 picks the family and the
// options, byte 1 where the text is cut in pieces; the rest is the reply. Parsing it in those
// pieces must give what parsing it whole gives (else markup leaked or text was lost): a mismatch
// aborts.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/chat/reply_parser.h"

namespace {
using moestream::ReplyDelta;

ReplyDelta parse(moestream::ReplyFormat f, const moestream::ReplyParserOptions& o, std::string_view text,
                 unsigned step) {
  moestream::ReplyParser p(f, o);
  ReplyDelta all;
  for (size_t at = 0; at < text.size();) {
    const size_t n = step == 0 ? text.size() : std::min<size_t>(step + at % 3, text.size() - at);
    all.append(p.feed(text.substr(at, n)));
    at += n;
  }
  all.append(p.finish());
  return all;
}

bool same(const ReplyDelta& a, const ReplyDelta& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i)
    if (a.calls[i].id != b.calls[i].id || a.calls[i].name != b.calls[i].name ||
        a.calls[i].arguments != b.calls[i].arguments)
      return false;
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"s": {"type": "string"}}}}}])");
  const auto format = moestream::ReplyFormat(data[0] % 6);
  moestream::ReplyParserOptions o;
  o.parse_tool_calls = data[0] & 0x10;
  o.starts_in_reasoning = data[0] & 0x20;
  o.tools = tools;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  const ReplyDelta whole = parse(format, o, text, 0);
  if (!same(whole, parse(format, o, text, 1u + data[1] % 16))) std::abort();
  return 0;
}
