// libFuzzer target: routing logs (read_routing_log: header, records, truncated tails).
#include "common/error.h"
#include "loader/format/routing_log.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = moestream::fuzz::write_input(data, size, "routing.log");
  try {
    moestream::read_routing_log(path);
  } catch (const moestream::Error&) {
  }
  return 0;
}
