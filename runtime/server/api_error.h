// An error the HTTP API reports to the client: status code plus the OpenAI error object
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace moestream {

class ApiError : public Error {
 public:
  ApiError(int status, std::string code, const std::string& message, std::string param = {})
      : Error(message), status_(status), code_(std::move(code)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& code() const { return code_; }
  const std::string& param() const { return param_; }
  // OpenAI's error types: 4xx are the caller's fault, 5xx the server's. Option marks in the
  // message are spelled for a client: JSON fields, or the server's flags (runtime/engine/options.h).
  nlohmann::json body() const;

 private:
  int status_;
  std::string code_, param_;
};

// A 500 whose detail (often an IoError naming a server path) stays on the server: logs
// "moestream-server: error ID (code): detail" on stderr and returns an ApiError whose message
// gives the client only the error id to quote.
ApiError internal_error(const std::string& code, const std::string& detail);

// Throws a 400 invalid_request_error "PARAM: MSG" naming the request field `param`. Inline: the
// request parser's fuzz target builds that parser's source alone, without this library.
[[noreturn]] inline void bad_param(const std::string& param, const std::string& msg) {
  throw ApiError(400, "invalid_request_error", param + ": " + msg, param);
}

}  // namespace moestream
