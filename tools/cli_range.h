// CLI11 validator over common/checked.h's check_range, for every numeric flag of the tools: the
// same bounds and message as the library's own checks, and NaN or infinity refused (CLI::Range
// lets NaN through, since every comparison with it is false).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/checked.h"

namespace moestream {

// The flag's value parsed as T must lie in [lo, hi]; CLI11 prefixes the error with the flag name.
template <class T>
CLI::Validator in_range(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T v{};
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a valid number";
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
