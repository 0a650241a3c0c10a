// Python semantics of template values for the chat-template evaluator: truthiness, str()/repr(),
// json.dumps as transformers' tojson calls it, and the string helpers the methods and filters use.
#include "runtime/chat/jinja_value.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "runtime/chat/chat_template.h"

namespace moestream::jinja {

using VT = Value::value_t;

[[noreturn]] void fail(int line, const std::string& msg) {
  if (line <= 0) throw ChatTemplateError("chat template: " + msg);  // a helper that knows no line
  throw ChatTemplateError("chat template line " + std::to_string(line) + ": " + msg);
}

Value undefined() { return Value(VT::discarded); }

namespace {
constexpr std::uint8_t kMacroSubtype = 'M';
}

Value make_macro(size_t index, const std::string& name) {
  std::vector<std::uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = std::uint8_t(uint64_t(index) >> (8 * i));
  bytes.insert(bytes.end(), name.begin(), name.end());
  return Value::binary(std::move(bytes), kMacroSubtype);
}
bool is_macro(const Value& v) {
  return v.is_binary() && v.get_binary().has_subtype() && v.get_binary().subtype() == kMacroSubtype &&
         v.get_binary().size() >= 8;
}
size_t macro_index(const Value& v) {
  uint64_t i = 0;
  for (int k = 0; k < 8; ++k) i |= uint64_t(v.get_binary()[size_t(k)]) << (8 * k);
  return size_t(i);
}
std::string macro_name(const Value& v) { return std::string(v.get_binary().begin() + 8, v.get_binary().end()); }
bool is_undef(const Value& v) { return v.is_discarded(); }

const char* type_name(const Value& v) {
  if (is_undef(v)) return "undefined";
  switch (v.type()) {
    case VT::null: return "none";
    case VT::boolean: return "bool";
    case VT::string: return "string";
    case VT::array: return "list";
    case VT::object: return "dict";
    case VT::number_float: return "float";
    case VT::binary: return "Macro";
    default: return "int";
  }
}

bool truthy(const Value& v) {
  if (is_undef(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_float()) return v.get<double>() != 0;
  if (v.is_number()) return v.get<int64_t>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

// Python's json.dumps(ensure_ascii=False) string escaping.
void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  std::string s = Value(d).dump();  // shortest round-trip form, like Python's repr
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

bool nests_deeper(const Value& v, int limit) {
  if (!v.is_structured()) return false;
  if (limit < 1) return true;
  // One frame per open container: the stack holds at most limit + 1 entries.
  std::vector<std::pair<const Value*, Value::const_iterator>> stack{{&v, v.cbegin()}};
  while (!stack.empty()) {
    auto& [node, it] = stack.back();
    if (it == node->cend()) {
      stack.pop_back();
      continue;
    }
    const Value& child = *it;
    ++it;
    if (!child.is_structured()) continue;
    if (int(stack.size()) >= limit) return true;
    stack.emplace_back(&child, child.cbegin());
  }
  return false;
}

size_t approx_bytes(const Value& v, size_t stop_at) {
  size_t total = 0;
  std::vector<const Value*> todo{&v};
  while (!todo.empty() && total <= stop_at) {
    const Value* x = todo.back();
    todo.pop_back();
    total += 16;
    if (x->is_string()) {
      total += x->get_ref<const std::string&>().size();
    } else if (x->is_object()) {
      for (auto it = x->cbegin(); it != x->cend(); ++it) {
        total += it.key().size();
        todo.push_back(&it.value());
      }
    } else if (x->is_array()) {
      for (const auto& e : *x) todo.push_back(&e);
    }
  }
  return total;
}

void check_bytes(size_t n, int line, const std::string& what) {
  if (n > kMaxTemplateValueBytes)
    fail(line, what + " would be larger than the limit of " + std::to_string(kMaxTemplateValueBytes >> 20) +
                   " MiB for a template value");
}

// json.dumps(x, ensure_ascii=False, indent=indent) as transformers' tojson filter calls it.
void dumps(const Value& v, int indent, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    const size_t n = size_t(indent) * size_t(d);  // both small: indent is checked by the caller
    check_bytes(out.size() + n, 0, "tojson output");
    out.append(n, ' ');
  };
  if (is_undef(v)) fail(0, "tojson of an undefined value");
  if (v.is_binary()) fail(0, "Object of type Macro is not JSON serializable");
  if (depth > kMaxTemplateValueDepth)
    fail(0, "tojson of a value nested deeper than the limit of " + std::to_string(kMaxTemplateValueDepth) +
                " levels");
  check_bytes(out.size(), 0, "tojson output");
  switch (v.type()) {
    case VT::null: out += "null"; return;
    case VT::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case VT::string: json_string(v.get_ref<const std::string&>(), out); return;
    case VT::number_float: out += float_repr(v.get<double>()); return;
    case VT::array: {
      if (v.empty()) { out += "[]"; return; }
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        dumps(e, indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case VT::object: {
      if (v.empty()) { out += "{}"; return; }
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(depth + 1);
        json_string(it.key(), out);
        out += ": ";
        dumps(it.value(), indent, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default: out += v.dump(); return;
  }
}

// Python str() of a value, which is what {{ x }} prints.
std::string py_str(const Value& v) {
  if (is_undef(v)) return "";
  switch (v.type()) {
    case VT::null: return "None";
    case VT::boolean: return v.get<bool>() ? "True" : "False";
    case VT::string: return v.get<std::string>();
    case VT::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      return float_repr(d);
    }
    case VT::array: case VT::object: return py_repr(v);
    case VT::binary: return "<Macro '" + macro_name(v) + "'>";
    default: return v.dump();
  }
}

std::string py_repr(const Value& v, int depth) {
  if (depth > kMaxTemplateValueDepth)
    fail(0, "printing a value nested deeper than the limit of " + std::to_string(kMaxTemplateValueDepth) +
                " levels");
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, q);
    for (char c : s) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c == q) out += std::string("\\") + q;
      else out += c;
    }
    return out + q;
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      out += (i ? ", " : "") + py_repr(v[i], depth + 1);
      check_bytes(out.size(), 0, "the printed list");
    }
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += (first ? "" : ", ") + py_repr(Value(it.key())) + ": " + py_repr(it.value(), depth + 1);
      check_bytes(out.size(), 0, "the printed dict");
      first = false;
    }
    return out + "}";
  }
  return py_str(v);
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto drop = [&](char c) {
    if (!chars || chars->is_null()) return is_ws(c);
    return chars->get_ref<const std::string&>().find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) while (b < e && drop(s[b])) ++b;
  if (right) while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Value split(const std::string& s, const Value* sep) {
  Value out = Value::array();
  if (!sep || sep->is_null()) {  // Python: runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_ws(s[i])) ++i;
      size_t j = i;
      while (j < s.size() && !is_ws(s[j])) ++j;
      if (j > i && out.size() >= kMaxTemplateListItems)
        fail(0, "split() into more than the limit of " + std::to_string(kMaxTemplateListItems) + " items");
      if (j > i) out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->get_ref<const std::string&>();
  if (d.empty()) throw ChatTemplateError("chat template: split() with an empty separator");
  size_t i = 0;
  while (true) {
    size_t j = s.find(d, i);
    if (j == std::string::npos) {
      out.push_back(s.substr(i));
      return out;
    }
    if (out.size() >= kMaxTemplateListItems) fail(0, "split() into more than the limit of " +
                                                         std::to_string(kMaxTemplateListItems) + " items");
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
}

// Builds the result in one pass (replacing in place is quadratic) and stops at the size limit.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int line) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  for (size_t j = s.find(from); j != std::string::npos; j = s.find(from, i)) {
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    check_bytes(out.size() + (s.size() - i), line, "the result of replace");
  }
  out.append(s, i, std::string::npos);
  return out;
}

std::string title_case(const std::string& s, bool only_first) {
  std::string out = s;
  bool start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = out[i];
    if (std::isalpha(c)) {
      out[i] = char(start ? std::toupper(c) : std::tolower(c));
      start = false;
    } else if (!only_first) {
      start = true;
    } else {
      start = false;
    }
  }
  return out;
}

namespace {
[[noreturn]] void overflow(int line, int64_t x, const std::string& op, int64_t y) {
  fail(line, "integer overflow: " + std::to_string(x) + " " + op + " " + std::to_string(y) +
                 " is outside the 64-bit range");
}
}  // namespace

// Python's integer operators on int64, refusing a result Python would make a big int (wrapping
// would print a wrong number; signed overflow is undefined behaviour in C++).
Value int_arith(const std::string& op, int64_t x, int64_t y, int line) {
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) overflow(line, x, op, y);
    return Value(r);
  }
  if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) overflow(line, x, op, y);
    return Value(r);
  }
  if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) overflow(line, x, op, y);
    return Value(r);
  }
  if (op == "**") {
    if (y < 0) {  // Python gives a float
      if (x == 0) fail(line, "0 cannot be raised to a negative power");
      return Value(std::pow(double(x), double(y)));
    }
    int64_t result = 1, base = x;
    for (int64_t e = y; e != 0;) {  // square-and-multiply; base is squared only while bits remain
      if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow(line, x, op, y);
      e >>= 1;
      if (e != 0 && __builtin_mul_overflow(base, base, &base)) overflow(line, x, op, y);
    }
    return Value(result);
  }
  if (y == 0) fail(line, "division by zero");
  if (op == "//") {
    if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow(line, x, op, y);
    int64_t q = x / y;
    if (x % y != 0 && ((x < 0) != (y < 0))) --q;  // floor, as Python rounds
    return Value(q);
  }
  if (op == "%") {
    if (y == -1) return Value(0);  // INT64_MIN % -1 is undefined in C++; Python gives 0
    int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) m += y;  // the sign of the divisor, as in Python
    return Value(m);
  }
  fail(line, "unknown operator " + op);
}

int64_t as_int(const Value& v, int line, const char* what) {
  if (v.is_number_integer() || v.is_boolean()) return v.is_boolean() ? v.get<bool>() : v.get<int64_t>();
  fail(line, std::string(what) + " must be an integer, got " + type_name(v));
}

// Python's normalisation of a slice bound.
int64_t clamp_index(int64_t i, int64_t n, bool for_stop_neg_step) {
  if (i < 0) i += n;
  if (for_stop_neg_step) return std::clamp<int64_t>(i, -1, n - 1);
  return std::clamp<int64_t>(i, 0, n);
}

}  // namespace moestream::jinja
