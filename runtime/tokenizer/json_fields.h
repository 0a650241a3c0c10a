// Typed access to tokenizer.json fields: every failure names the file and the JSON path
// ("pre_tokenizer.pretokenizers[0].pattern.Regex") so a bad file can be fixed without a debugger.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moestream::tok {

using Json = nlohmann::json;

class JsonFields {
 public:
  explicit JsonFields(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  // Required member `key` of object `obj` (at `path`); FormatError when absent or not an object.
  const Json& at(const Json& obj, const char* key, const std::string& path) const;
  // Member `key` or nullptr when absent or null.
  const Json* find(const Json& obj, const char* key, const std::string& path) const;

  std::string str(const Json& v, const std::string& path) const;
  bool boolean(const Json& v, const std::string& path) const;
  int64_t integer(const Json& v, const std::string& path, int64_t lo, int64_t hi) const;
  void expect_object(const Json& v, const std::string& path) const;
  void expect_array(const Json& v, const std::string& path) const;

  // Optional members with a default.
  std::string str_or(const Json& obj, const char* key, const std::string& path,
                     std::string dflt) const;
  bool bool_or(const Json& obj, const char* key, const std::string& path, bool dflt) const;

  // The "type" of a component object.
  std::string type_of(const Json& obj, const std::string& path) const;

  // Calls each(element, element_path) for every element of the array member `key` of `obj`:
  // the steps of a "Sequence" component. FormatError when absent or not an array.
  template <class Each>
  void for_each_in(const Json& obj, const char* key, const std::string& path, Each&& each) const;

  [[noreturn]] void bad(const std::string& path, const std::string& what) const;  // FormatError
  [[noreturn]] void unsupported(const std::string& path, const std::string& what) const;  // ConfigError
  // ConfigError "unsupported <component> '<type>' (supported: <supported>)" at path.type.
  [[noreturn]] void unsupported_type(const std::string& path, const char* component, const std::string& type,
                                     const char* supported) const;

 private:
  std::string file_;
};

// A "Replace" component (normalizer or decoder): {"pattern": {"String": s} or {"Regex": r},
// "content": c}. `literal` holds a String pattern; otherwise `regex` points at a Regex one (not
// read: only the normalizer supports it), or neither is set.
struct ReplaceFields {
  std::string pattern_path, content;
  std::optional<std::string> literal;
  const Json* regex = nullptr;
};
ReplaceFields read_replace(const JsonFields& f, const Json& obj, const std::string& path);

inline std::string join_path(const std::string& base, std::string_view key) {
  return base.empty() ? std::string(key) : base + "." + std::string(key);
}
inline std::string index_path(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

template <class Each>
void JsonFields::for_each_in(const Json& obj, const char* key, const std::string& path, Each&& each) const {
  const Json& list = at(obj, key, path);
  const std::string lp = join_path(path, key);
  expect_array(list, lp);
  for (size_t i = 0; i < list.size(); ++i) each(list[i], index_path(lp, i));
}

// The steps of a "Sequence" component (the array member `key` of `obj`), each built by
// make(step, f, step_path): make_normalizer, make_pre_tokenizer, make_token_decoder.
template <class Component, class Make>
std::vector<std::unique_ptr<Component>> sequence_steps(const JsonFields& f, const Json& obj, const char* key,
                                                       const std::string& path, Make make) {
  std::vector<std::unique_ptr<Component>> steps;
  f.for_each_in(obj, key, path,
                [&](const Json& step, const std::string& sp) { steps.push_back(make(step, f, sp)); });
  return steps;
}

}  // namespace moestream::tok
