// libFuzzer target: the per-layer `.map` (decode_expert_map, then the file loader's checks).
#include <string_view>

#include "common/error.h"
#include "loader/format/expert_map.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    moestream::decode_expert_map(bytes, "fuzz/layer_000.map");
  } catch (const moestream::Error&) {
  }
  auto path = moestream::fuzz::write_input(data, size, "layer_000.map");
  try {
    moestream::load_expert_map_file(path, 8);
  } catch (const moestream::Error&) {
  }
  return 0;
}
