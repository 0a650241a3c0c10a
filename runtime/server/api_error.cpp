// Implementation of runtime/server/api_error.h's internal_error.
#include "runtime/server/api_error.h"

#include <atomic>
#include <cstdio>
#include <random>

namespace moestream {

ApiError internal_error(const std::string& code, const std::string& detail) {
  // Unique within a run and unlikely to repeat across restarts, so a log line can be found.
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device{}();
  char id[32];
  std::snprintf(id, sizeof id, "E%08x-%llu", salt, (unsigned long long)++counter);
  std::fprintf(stderr, "moestream-server: error %s (%s): %s\n", id, code.c_str(), detail.c_str());
  return ApiError(500, code, std::string("internal server error (error id ") + id +
                                 "); the server log has the details");
}

}  // namespace moestream
