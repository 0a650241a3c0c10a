// Implementation of runtime/server/api_error.h.
#include "runtime/server/api_error.h"

#include <atomic>
#include <cstdio>
#include <random>

#include "runtime/engine/options.h"

namespace moestream {

nlohmann::json ApiError::body() const {
  nlohmann::json e{{"message", render_options(what(), OptionCaller::kServerRequest)},
                   {"type", status_ >= 500 ? "server_error" : "invalid_request_error"},
                   {"param", param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_)},
                   {"code", code_}};
  return nlohmann::json{{"error", e}};
}

ApiError internal_error(const std::string& code, const std::string& detail) {
  // Unique within a run and unlikely to repeat across restarts, so a log line can be found.
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device{}();
  char id[32];
  std::snprintf(id, sizeof id, "E%08x-%llu", salt, (unsigned long long)++counter);
  std::fprintf(stderr, "moestream-server: error %s (%s): %s\n", id, code.c_str(),
               render_options(detail, OptionCaller::kCli).c_str());
  return ApiError(500, code, std::string("internal server error (error id ") + id +
                                 "); the server log has the details");
}

}  // namespace moestream
