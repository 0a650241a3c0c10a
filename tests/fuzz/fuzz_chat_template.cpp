// libFuzzer target: chat templates (ChatTemplate parse, then a render with a fixed conversation).
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi <b>there</b>"},
                 {"role": "assistant", "content": "Hello."},
                 {"role": "user", "content": "2+2?"}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})");
  std::string source(reinterpret_cast<const char*>(data), size);
  try {
    moestream::ChatTemplate tpl(source);
    tpl.render(context);
  } catch (const moestream::Error&) {  // ChatTemplateError is a ConfigError
  }
  return 0;
}
