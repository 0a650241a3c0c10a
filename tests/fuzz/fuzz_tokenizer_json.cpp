// libFuzzer target: tokenizer.json (Tokenizer::load), then an encode/decode round with the
// loaded tokenizer so the parsed tables are exercised too.
#include <vector>

#include "common/error.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = moestream::fuzz::write_input(data, size, "tokenizer.json");
  // An empty config path would pick up a tokenizer_config.json beside it: none is written.
  try {
    auto tok = moestream::Tokenizer::load(path);
    auto ids = tok.encode("Hello, w\xc3\xb6rld! <s> 123  \n\tab");
    ids.push_back(0);
    ids.push_back(-1);
    ids.push_back(1 << 30);
    tok.decode(ids);
    tok.decode(ids, /*skip_special_tokens=*/true);
  } catch (const moestream::Error&) {
  }
  return 0;
}
