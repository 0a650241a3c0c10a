// Chat-template evaluator, calls: the global functions (raise_exception, namespace, dict, range,
// strftime_now), string and dict methods, and macros.
#include <algorithm>
#include <cctype>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_evaluator.h"

namespace moestream::jinja {

Value Evaluator::call(const Expr& e) {
  const Expr& callee = *e.args[0];
  std::vector<Value> a = eval_args(e, 1);
  if (callee.kind == Expr::Kind::kName) {
    if (callee.name == "raise_exception")
      throw ChatTemplateError("chat template: " + (a.empty() ? std::string("error") : py_str(a[0])));
    if (callee.name == "namespace" || callee.name == "dict") {
      Value ns = Value::object();
      if (callee.name == "namespace") ns["__namespace__"] = true;
      for (const auto& [k, v] : e.kwargs) ns[k] = eval(*v);
      return ns;
    }
    if (callee.name == "range") {
      int64_t lo = 0, hi = 0, st = 1;
      if (a.size() == 1) hi = as_int(a[0], e.line, "range()");
      else if (a.size() >= 2) {
        lo = as_int(a[0], e.line, "range()");
        hi = as_int(a[1], e.line, "range()");
        if (a.size() > 2) st = as_int(a[2], e.line, "range()");
      }
      if (st == 0) fail(e.line, "range() step must not be zero");
      // Item count in 128 bits: hi - lo overflows int64 for far-apart bounds.
      const __int128 span = st > 0 ? __int128(hi) - lo : __int128(lo) - hi;
      const __int128 step_abs = st > 0 ? __int128(st) : -__int128(st);
      const __int128 count = span <= 0 ? 0 : (span + step_abs - 1) / step_abs;
      if (count > kMaxTemplateRangeItems)
        fail(e.line, "range() of more than the limit of " + std::to_string(kMaxTemplateRangeItems) + " items");
      Value out = Value::array();
      for (int64_t k = 0; k < int64_t(count); ++k) out.push_back(int64_t(lo + __int128(k) * st));
      return out;
    }
    fail(e.line, "unknown function '" + callee.name + "'");
  }
  if (callee.kind != Expr::Kind::kAttr) fail(e.line, "this expression cannot be called");
  const Value obj = eval(*callee.args[0]);
  const std::string& m = callee.name;
  if (obj.is_string()) {
    const std::string& s = obj.get_ref<const std::string&>();
    auto str_arg = [&](size_t i) {
      if (i >= a.size() || !a[i].is_string()) fail(e.line, m + "() needs a string argument");
      return a[i].get<std::string>();
    };
    if (m == "startswith") { const auto p = str_arg(0); return Value(s.rfind(p, 0) == 0); }
    if (m == "endswith") {
      const auto p = str_arg(0);
      return Value(s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0);
    }
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      const Value* chars = a.empty() ? nullptr : &a[0];
      if (chars && !chars->is_string() && !chars->is_null()) fail(e.line, m + "() needs a string");
      return Value(strip(s, chars, m != "rstrip", m != "lstrip"));
    }
    if (m == "split") {
      const Value* sep = a.empty() ? nullptr : &a[0];
      if (sep && !sep->is_string() && !sep->is_null()) fail(e.line, "split() needs a string separator");
      return split(s, sep);
    }
    if (m == "upper" || m == "lower") {
      std::string out = s;
      for (char& c : out) c = char(m == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      return Value(out);
    }
    if (m == "replace") return built(replace_all(s, str_arg(0), str_arg(1), e.line), e.line);
    if (m == "title") return Value(title_case(s, false));
    if (m == "capitalize") return Value(title_case(s, true));
    fail(e.line, "unsupported string method '" + m + "'");
  }
  if (obj.is_object()) {
    if (m == "get") {
      const Value v = a.empty() || !a[0].is_string() ? undefined() : get_item(obj, a[0], e.line, false);
      return is_undef(v) ? (a.size() > 1 ? a[1] : Value(nullptr)) : v;
    }
    if (m == "items" || m == "keys" || m == "values") {
      Value out = Value::array();
      for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (it.key() == "__namespace__") continue;
        if (m == "items") out.push_back(Value::array({it.key(), it.value()}));
        else if (m == "keys") out.push_back(it.key());
        else out.push_back(it.value());
      }
      return out;
    }
  }
  fail(e.line, "unsupported method '" + m + "' on " + type_name(obj));
}

}  // namespace moestream::jinja
