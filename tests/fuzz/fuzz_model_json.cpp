// libFuzzer target: model.json (ModelConfig::from_json). Typed errors are the expected answer to
// bad input; anything else (a crash, a sanitizer report, another exception type) is a finding.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/format/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    moestream::ModelConfig::from_json(j, "fuzz/model.json");
  } catch (const moestream::Error&) {
  }
  return 0;
}
