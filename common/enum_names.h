// An enum's names as one table read both ways (value -> name for files and logs, name -> value
// when parsing), so the two directions cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace moestream {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

// The name of v in `table`; `unknown` for a value the table lacks.
template <class E, size_t N>
constexpr std::string_view enum_name(const EnumName<E> (&table)[N], E v, std::string_view unknown) {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return unknown;
}

// The value named `name`; nullopt for a name the table lacks.
template <class E, size_t N>
constexpr std::optional<E> enum_from_name(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& e : table)
    if (e.name == name) return e.value;
  return std::nullopt;
}

// "a, b or c": the accepted names, for an error message.
template <class E, size_t N>
std::string enum_name_list(const EnumName<E> (&table)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) s += i + 1 == N ? " or " : ", ";
    s += table[i].name;
  }
  return s;
}

}  // namespace moestream
