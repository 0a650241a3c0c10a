// Implementation of common/checked.h.
#include "common/checked.h"

#include <cstdio>

namespace moestream {
namespace {

uint64_t units_to_bytes(uint64_t n, unsigned shift, std::string_view name, const char* unit) {
  if (n > (std::numeric_limits<uint64_t>::max() >> shift))
    throw ConfigError(std::string(name) + " = " + std::to_string(n) + " " + unit +
                      " overflows 64 bits in bytes");
  return n << shift;
}

}  // namespace

uint64_t kib_to_bytes(uint64_t kib, std::string_view name) { return units_to_bytes(kib, 10, name, "KiB"); }
uint64_t mib_to_bytes(uint64_t mib, std::string_view name) { return units_to_bytes(mib, 20, name, "MiB"); }

std::string gib_text(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(uint64_t(1) << 30));
  return buf;
}

size_t checked_product(std::initializer_list<uint64_t> factors, std::string_view what) {
  size_t p = 1;
  bool overflow = false;
  std::string text;
  for (uint64_t f : factors) {
    if (!text.empty()) text += " x ";
    text += std::to_string(f);
    if (f > std::numeric_limits<size_t>::max()) {
      overflow = true;
    } else if (!overflow && __builtin_mul_overflow(p, size_t(f), &p)) {
      overflow = true;
    }
  }
  if (overflow) throw ConfigError(std::string(what) + ": " + text + " overflows the size type");
  return p;
}

void throw_alloc_failure(std::string_view what, uint64_t bytes, std::string_view source) {
  throw ConfigError(std::string(what) + ": cannot allocate " + std::to_string(bytes) + " bytes (" +
                    std::to_string(bytes >> 20) + " MiB), sized by " + std::string(source));
}

}  // namespace moestream
