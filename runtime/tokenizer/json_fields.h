// Typed access to tokenizer.json fields: every failure names the file and the JSON path
// ("pre_tokenizer.pretokenizers[0].pattern.Regex") so a bad file can be fixed without a debugger.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

  [[noreturn]] void bad(const std::string& path, const std::string& what) const;  // FormatError
  [[noreturn]] void unsupported(const std::string& path, const std::string& what) const;  // ConfigError

 private:
  std::string file_;
};

inline std::string join_path(const std::string& base, std::string_view key) {
  return base.empty() ? std::string(key) : base + "." + std::string(key);
}
inline std::string index_path(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

}  // namespace moestream::tok
