// libFuzzer target: safetensors header (SafetensorsFile opens and validates the header).
#include "common/error.h"
#include "loader/format/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = moestream::fuzz::write_input(data, size, "model.safetensors");
  try {
    moestream::SafetensorsFile f(path);
  } catch (const moestream::Error&) {
  }
  return 0;
}
