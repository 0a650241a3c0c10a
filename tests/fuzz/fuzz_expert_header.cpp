// libFuzzer target: expert file header (decode_expert_header). The first 8 input bytes are the
// file size the header is checked against (little-endian), the rest the header bytes.
#include <cstring>
#include <string_view>

#include "common/error.h"
#include "loader/format/expert_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t file_size = 0;
  std::memcpy(&file_size, data, 8);
  std::string_view bytes(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    moestream::decode_expert_header(bytes, file_size, "fuzz/layer_000.bin");
  } catch (const moestream::Error&) {
  }
  return 0;
}
