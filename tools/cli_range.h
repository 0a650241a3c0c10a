// CLI11 validator over common/checked.h's check_range, for every numeric flag of the tools: the
// same bounds and message as the library's own checks, and NaN or infinity refused (CLI::Range
// lets NaN through, since every comparison with it is false).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <string>
#include <system_error>
#include <type_traits>

#include "common/checked.h"

namespace moestream {

// Integers in decimal only, the whole text, and no overflow: CLI11's own conversion turns "-1"
// into 2^64 - 1 for an unsigned flag and saturates 10^30, so both would pass as valid values.
template <class T>
bool parse_flag_number(const std::string& text, T& v) {
  if constexpr (std::is_integral_v<T>) {
    const char* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    return !text.empty() && ec == std::errc() && p == end;
  } else {
    return CLI::detail::lexical_cast(text, v);
  }
}

// The flag's value parsed as T must lie in [lo, hi]; CLI11 prefixes the error with the flag name.
// Integer flags without a narrower range (a seed) take the whole type's, for the strict parse.
template <class T>
CLI::Validator in_range(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T v{};
        if (!parse_flag_number(text, v)) return "'" + text + "' is not a valid number";
        try {
          check_range("value", v, lo, hi);
        } catch (const ConfigError& e) {
          return e.what();
        }
        return {};
      },
      "[" + detail::number_text(lo) + ", " + detail::number_text(hi) + "]");
}

}  // namespace moestream
