// Checked conversions for every numeric option and config field: a range check that also refuses
// NaN and infinities, KiB/MiB -> bytes that refuse to wrap, overflow-safe products for buffer
// sizes, and allocation failures that name what was allocated and what sized it. Shared by the
// tools, the store options, model.json and the Python bindings so each says it the same way.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "common/error.h"

namespace moestream {

// Limits every front end (infer, the server, Python) and Model::load enforce on engine options.
inline constexpr int kMaxThreads = 1024;              // one OS thread each
inline constexpr int kMaxContext = 1 << 24;           // KV cache positions (--ctx, ctx=)
inline constexpr float kMaxCacheTolerance = 1000.0f;  // --cache-tolerance, in top-k logit ranges
inline constexpr uint64_t kMaxGpuCacheMb = uint64_t(1) << 30;  // 1 PiB: beyond any GPU

namespace detail {
template <class T>
std::string number_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    std::ostringstream s;
    s << v;  // "nan", "inf", "0.1": std::to_string would print "0.100000"
    return s.str();
  } else {
    return std::to_string(v);
  }
}
}  // namespace detail

// Throws ConfigError "<name> must be in [lo, hi], got v" (for floating point also when v is NaN or
// infinite, which every comparison would let through). Returns v.
template <class T>
T check_range(std::string_view name, T value, T lo, T hi) {
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value))
      throw ConfigError(std::string(name) + " must be a finite number in [" + detail::number_text(lo) + ", " +
                        detail::number_text(hi) + "], got " + detail::number_text(value));
  }
  if (value < lo || value > hi)
    throw ConfigError(std::string(name) + " must be in [" + detail::number_text(lo) + ", " +
                      detail::number_text(hi) + "], got " + detail::number_text(value));
  return value;
}

// `kib` KiB / `mib` MiB in bytes; ConfigError naming `name` when the product does not fit 64 bits
// (a shift would wrap to a small number, e.g. 0, and silently disable what the option sizes).
uint64_t kib_to_bytes(uint64_t kib, std::string_view name);
uint64_t mib_to_bytes(uint64_t mib, std::string_view name);

// "2.47 GiB": a size for messages, two decimals.
std::string gib_text(uint64_t bytes);

// The product of `factors` as size_t; ConfigError "<what>: a x b x ... overflows" when it does
// not fit (callers name the option or file the factors come from in `what`).
size_t checked_product(std::initializer_list<uint64_t> factors, std::string_view what);

// "<what>: cannot allocate N bytes (X MiB), sized by <source>": for a std::bad_alloc where a big
// buffer is sized from an option or a file. ConfigError: the user can ask for less.
[[noreturn]] void throw_alloc_failure(std::string_view what, uint64_t bytes, std::string_view source);

// Runs `alloc()`, turning std::bad_alloc (and std::length_error from a container asked for more
// than it can hold) into throw_alloc_failure(what, bytes, source).
template <class F>
decltype(auto) allocating(std::string_view what, uint64_t bytes, std::string_view source, F&& alloc) {
  try {
    return std::forward<F>(alloc)();
  } catch (const std::bad_alloc&) {
    throw_alloc_failure(what, bytes, source);
  } catch (const std::length_error&) {
    throw_alloc_failure(what, bytes, source);
  }
}

}  // namespace moestream
