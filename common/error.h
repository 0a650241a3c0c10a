// Error types shared by every module: expected failures throw one of these with a message that
// names the file, the field or offset, and what was expected; bugs hit MOE_ASSERT.
#pragma once

#include <stdexcept>
#include <string>

namespace moestream {

// Base of every error moestream throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A system call failed or a file is shorter than it claims (message carries path, offset, size,
// strerror).
class IoError : public Error {
 public:
  using Error::Error;
};

// A file exists but its content is wrong: bad magic, version, checksum, field, shape.
class FormatError : public Error {
 public:
  using Error::Error;
};

// The user asked for something inconsistent: bad option, unsupported architecture, bad config.
class ConfigError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace moestream

// For invariants whose failure is a bug in moestream, never for bad input.
#define MOE_ASSERT(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::moestream::assert_fail(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
