// Chat-template evaluator: filters and tests with Jinja's (and transformers') semantics.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_evaluator.h"

namespace moestream::jinja {

Value Evaluator::filter(const Expr& e) {
  const Value v = eval(*e.args[0]);
  std::vector<Value> a = eval_args(e, 1);
  const std::string& f = e.name;
  if (f == "length" || f == "count") {
    if (v.is_string()) return Value(int64_t(v.get_ref<const std::string&>().size()));
    if (v.is_array() || v.is_object()) return Value(int64_t(v.size()));
    if (is_undef(v)) return Value(0);
    fail(e.line, std::string("object of type ") + type_name(v) + " has no length");
  }
  if (f == "tojson") {
    Value ind = arg(a, 0);
    if (is_undef(ind)) ind = kwarg(e, "indent");
    if (ind.is_number_integer() && ind.get<int64_t>() > kMaxTemplateTojsonIndent)
      fail(e.line, "tojson indent " + std::to_string(ind.get<int64_t>()) + " is over the limit of " +
                       std::to_string(kMaxTemplateTojsonIndent));
    // Python indents a negative indent by '' (newlines only); None is compact.
    const int indent = ind.is_number_integer() ? int(std::max<int64_t>(ind.get<int64_t>(), 0)) : -1;
    std::string out;
    dumps(v, indent, 0, out);
    return built(std::move(out), e.line);
  }
  if (f == "trim") return Value(strip(py_str(v), nullptr, true, true));
  if (f == "upper" || f == "lower") {
    std::string s = py_str(v);
    for (char& c : s) c = char(f == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
    return Value(s);
  }
  if (f == "capitalize") return Value(title_case(py_str(v), true));
  if (f == "title") return Value(title_case(py_str(v), false));
  if (f == "string") return Value(py_str(v));
  if (f == "safe" || f == "e" || f == "escape") {
    if (f != "safe") fail(e.line, "html escaping is not supported");
    return v;
  }
  if (f == "int") {
    if (v.is_number_integer()) return v;
    if (v.is_number()) {
      const double d = v.get<double>();
      // Converting NaN or a double outside int64 is undefined behaviour in C++.
      if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0))
        fail(e.line, "int() of " + py_str(v) + " is outside the 64-bit range");
      return Value(int64_t(d));
    }
    if (v.is_string()) {
      try {
        return Value(int64_t(std::stoll(v.get<std::string>())));
      } catch (const std::out_of_range&) {
        fail(e.line, "int() of '" + v.get<std::string>().substr(0, 40) + "' is outside the 64-bit range");
      } catch (const std::invalid_argument&) {
        return Value(0);  // Jinja's int filter: not a number gives the default, 0
      }
    }
    return Value(0);
  }
  if (f == "float") {
    if (v.is_number()) return Value(v.get<double>());
    return Value(0.0);
  }
  if (f == "first" || f == "last") {
    const Value items = iterable_items(v, e.line);
    if (items.empty()) return undefined();
    return f == "first" ? items.front() : items.back();
  }
  if (f == "list") return iterable_items(v, e.line);
  if (f == "reverse") {
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      std::reverse(s.begin(), s.end());
      return Value(s);
    }
    Value items = iterable_items(v, e.line);
    std::reverse(items.begin(), items.end());
    return items;
  }
  if (f == "join") {
    Value sep = arg(a, 0);
    if (is_undef(sep)) sep = kwarg(e, "d");
    const std::string d = is_undef(sep) ? "" : py_str(sep);
    std::string out;
    bool first = true;
    for (const auto& x : iterable_items(v, e.line)) {
      if (!first) out += d;
      first = false;
      out += py_str(x);
      check_bytes(out.size(), e.line, "the result of join");
    }
    charge(out.size(), e.line);
    return Value(out);
  }
  if (f == "default" || f == "d") {
    const bool boolean = truthy(arg(a, 1)) || truthy(kwarg(e, "boolean"));
    if (is_undef(v) || (boolean && !truthy(v))) return a.empty() ? Value("") : a[0];
    return v;
  }
  if (f == "replace") {
    if (a.size() < 2) fail(e.line, "replace needs two arguments");
    return built(replace_all(py_str(v), py_str(a[0]), py_str(a[1]), e.line), e.line);
  }
  if (f == "items") {
    if (!v.is_object() && !is_undef(v)) fail(e.line, "Can only get item pairs from a mapping.");
    Value out = Value::array();
    if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) out.push_back(Value::array({it.key(), it.value()}));
    return out;
  }
  if (f == "selectattr" || f == "rejectattr") {
    if (a.empty() || !a[0].is_string()) fail(e.line, f + " needs an attribute name");
    Value out = Value::array();
    for (const auto& x : iterable_items(v, e.line)) {
      const Value attr = get_item(x, a[0], e.line, true);
      const bool ok = a.size() < 2 ? truthy(attr) : apply_test(py_str(a[1]), attr, {a.begin() + 2, a.end()}, e.line);
      if (ok == (f == "selectattr")) out.push_back(x);
    }
    return out;
  }
  if (f == "map") {
    const Value attr = kwarg(e, "attribute");
    if (!attr.is_string()) fail(e.line, "map supports only attribute=");
    Value out = Value::array();
    for (const auto& x : iterable_items(v, e.line)) out.push_back(get_item(x, attr, e.line, true));
    return out;
  }
  if (f == "abs") {
    if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if (x == std::numeric_limits<int64_t>::min())
        fail(e.line, "integer overflow: abs(" + std::to_string(x) + ") is outside the 64-bit range");
      return Value(x < 0 ? -x : x);
    }
    if (v.is_number()) return Value(std::fabs(v.get<double>()));
    fail(e.line, "abs of " + std::string(type_name(v)));
  }
  fail(e.line, "unsupported filter '" + f + "'");
}

bool Evaluator::apply_test(const std::string& t, const Value& v, const std::vector<Value>& a, int line) {
  if (t == "defined") return !is_undef(v);
  if (t == "undefined") return is_undef(v);
  if (t == "none") return v.is_null();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer();
  if (t == "float") return v.is_number_float();
  if (t == "boolean") return v.is_boolean();
  if (t == "true") return v.is_boolean() && v.get<bool>();
  if (t == "false") return v.is_boolean() && !v.get<bool>();
  if (t == "mapping") return v.is_object();
  if (t == "sequence" || t == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (t == "callable") return is_macro(v);
  if (t == "eq" || t == "equalto" || t == "==") return !a.empty() && v == a[0];
  if (t == "ne" || t == "!=") return a.empty() || v != a[0];
  if (t == "odd" || t == "even") {
    const int64_t n = as_int(v, line, "odd/even");
    return (n % 2 != 0) == (t == "odd");
  }
  if (t == "divisibleby") {
    const int64_t d = a.empty() ? 0 : as_int(a[0], line, "divisibleby");
    if (d == -1) return true;  // INT64_MIN % -1 is undefined in C++
    return d != 0 && as_int(v, line, "divisibleby") % d == 0;
  }
  if (t == "in") return !a.empty() && contains(a[0], v, line);
  if (t == "lower" || t == "upper") {
    if (!v.is_string()) return false;
    for (char c : v.get_ref<const std::string&>())
      if (std::isalpha((unsigned char)c) && (t == "lower" ? std::isupper((unsigned char)c) : std::islower((unsigned char)c)))
        return false;
    return true;
  }
  fail(line, "unsupported test '" + t + "'");
}

bool Evaluator::test(const Expr& e) {
  return apply_test(e.name, eval(*e.args[0]), eval_args(e, 1), e.line);
}

}  // namespace moestream::jinja
