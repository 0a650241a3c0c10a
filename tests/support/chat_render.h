// Test support for the chat-template suites (chat_template_test, chat_macro_test): render a
// template, expect a ChatTemplateError naming the limit or the operation, repeat a fragment.
// Header-only; needs runtime/chat and gtest.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "runtime/chat/chat_template.h"

namespace moestream::test {

inline std::string render(const std::string& source,
                          const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  return ChatTemplate(source).render(ctx);
}

// Expects a ChatTemplateError whose message contains `needle` (the limit or the operation).
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

inline void expect_parse_error(const std::string& source, const std::string& needle) {
  expect_error([&] { ChatTemplate t(source); }, needle);
}

inline void expect_render_error(const std::string& source, const std::string& needle,
                                const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  ChatTemplate t(source);
  expect_error([&] { t.render(ctx); }, needle);
}

inline std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace moestream::test
