// Typed, path-naming accessors over nlohmann::json used by the tokenizer loader.
#include "runtime/tokenizer/json_fields.h"

#include "common/error.h"

namespace moestream::tok {

namespace {
const char* kind_name(const Json& v) {
  return v.type_name();
}
}  // namespace

void JsonFields::bad(const std::string& path, const std::string& what) const {
  throw FormatError(file_ + ": field '" + path + "': " + what);
}

void JsonFields::unsupported(const std::string& path, const std::string& what) const {
  throw ConfigError(file_ + ": field '" + path + "': " + what);
}

void JsonFields::unsupported_type(const std::string& path, const char* component, const std::string& type,
                                  const char* supported) const {
  unsupported(join_path(path, "type"),
              "unsupported " + std::string(component) + " '" + type + "' (supported: " + supported + ")");
}

void JsonFields::expect_object(const Json& v, const std::string& path) const {
  if (!v.is_object()) bad(path, std::string("expected an object, found ") + kind_name(v));
}

void JsonFields::expect_array(const Json& v, const std::string& path) const {
  if (!v.is_array()) bad(path, std::string("expected an array, found ") + kind_name(v));
}

const Json& JsonFields::at(const Json& obj, const char* key, const std::string& path) const {
  expect_object(obj, path);
  auto it = obj.find(key);
  if (it == obj.end()) bad(join_path(path, key), "missing");
  return *it;
}

const Json* JsonFields::find(const Json& obj, const char* key, const std::string& path) const {
  expect_object(obj, path);
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string JsonFields::str(const Json& v, const std::string& path) const {
  if (!v.is_string()) bad(path, std::string("expected a string, found ") + kind_name(v));
  return v.get<std::string>();
}

bool JsonFields::boolean(const Json& v, const std::string& path) const {
  if (!v.is_boolean()) bad(path, std::string("expected a boolean, found ") + kind_name(v));
  return v.get<bool>();
}

int64_t JsonFields::integer(const Json& v, const std::string& path, int64_t lo, int64_t hi) const {
  int64_t x;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) bad(path, "value " + std::to_string(u) + " out of range");
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    bad(path, std::string("expected an integer, found ") + kind_name(v));
  }
  if (x < lo || x > hi) {
    bad(path, "value " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  }
  return x;
}

std::string JsonFields::str_or(const Json& obj, const char* key, const std::string& path,
                               std::string dflt) const {
  const Json* v = find(obj, key, path);
  return v ? str(*v, join_path(path, key)) : dflt;
}

bool JsonFields::bool_or(const Json& obj, const char* key, const std::string& path,
                         bool dflt) const {
  const Json* v = find(obj, key, path);
  return v ? boolean(*v, join_path(path, key)) : dflt;
}

std::string JsonFields::type_of(const Json& obj, const std::string& path) const {
  return str(at(obj, "type", path), join_path(path, "type"));
}

ReplaceFields read_replace(const JsonFields& f, const Json& obj, const std::string& path) {
  ReplaceFields r;
  const Json& pattern = f.at(obj, "pattern", path);
  r.pattern_path = join_path(path, "pattern");
  r.content = f.str(f.at(obj, "content", path), join_path(path, "content"));
  if (const Json* s = f.find(pattern, "String", r.pattern_path)) {
    r.literal = f.str(*s, join_path(r.pattern_path, "String"));
  } else {
    r.regex = f.find(pattern, "Regex", r.pattern_path);
  }
  return r;
}

}  // namespace moestream::tok
