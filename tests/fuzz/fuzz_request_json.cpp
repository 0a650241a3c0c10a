// libFuzzer target: the server's request parsing (parse_completion_request). The first byte picks
// chat (odd) or completions (even); the rest is the request body.
#include <string>

#include "runtime/server/completion_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  bool chat = data[0] & 1;
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  moestream::RequestLimits limits{"demo", 4096};
  try {
    moestream::parse_completion_request(body, chat, limits);
  } catch (const moestream::Error&) {  // ApiError and the typed errors: a 4xx answer
  }
  return 0;
}
