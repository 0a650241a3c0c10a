// Chat-template evaluator, calls: the global functions (raise_exception, namespace, dict, range,
// strftime_now), string and dict methods, and macros.
#include <algorithm>
#include <cctype>
#include <ctime>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_evaluator.h"

namespace moestream::jinja {

Value Evaluator::call(const Expr& e) {
  const Expr& callee = *e.args[0];
  std::vector<Value> a = eval_args(e, 1);
  if (callee.kind == Expr::Kind::kName) {
    if (const Value* v = find(callee.name); v && is_macro(*v)) return call_macro(*v, std::move(a), e);
    if (callee.name == "strftime_now") return strftime_now(a, e.line);
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

namespace {
// Restores the evaluator's macro state when a call ends, by return or by exception.
class MacroFrame {
 public:
  MacroFrame(std::vector<std::map<std::string, Value>>& scopes, size_t& floor, int& depth)
      : scopes_(scopes), floor_(floor), depth_(depth), saved_floor_(floor), saved_size_(scopes.size()) {
    ++depth_;
    floor_ = scopes_.size();
    scopes_.emplace_back();
  }
  ~MacroFrame() {
    scopes_.resize(saved_size_);
    floor_ = saved_floor_;
    --depth_;
  }
  MacroFrame(const MacroFrame&) = delete;
  MacroFrame& operator=(const MacroFrame&) = delete;

 private:
  std::vector<std::map<std::string, Value>>& scopes_;
  size_t& floor_;
  int& depth_;
  size_t saved_floor_, saved_size_;
};
}  // namespace

Value Evaluator::call_macro(const Value& m, std::vector<Value> pos, const Expr& e) {
  const size_t index = macro_index(m);
  if (index >= macros_.size()) fail(e.line, "macro '" + macro_name(m) + "' is not defined in this rendering");
  const Node& n = *macros_[index];
  if (macro_depth_ >= kMaxTemplateMacroDepth)
    fail(e.line, "macro calls nest deeper than the limit of " + std::to_string(kMaxTemplateMacroDepth) + " levels");
  if (++macro_calls_ > kMaxTemplateMacroCalls)
    fail(e.line, "more than the limit of " + std::to_string(kMaxTemplateMacroCalls) + " macro calls in one rendering");
  const std::string who = "macro '" + n.text + "'";
  // Arguments are evaluated in the caller's scope, before the macro's scope opens.
  std::vector<std::pair<std::string, Value>> named;
  for (const auto& [k, x] : e.kwargs) named.emplace_back(k, eval(*x));
  const size_t n_params = n.targets.size();
  if (pos.size() > n_params && !n.uses_varargs)
    fail(e.line, who + " takes not more than " + std::to_string(n_params) + " argument(s)");
  std::vector<Value> bound(n_params, undefined());
  std::vector<bool> given(n_params, false);
  for (size_t i = 0; i < std::min(pos.size(), n_params); ++i) {
    bound[i] = std::move(pos[i]);
    given[i] = true;
  }
  Value varargs = Value::array(), kwargs = Value::object();
  for (size_t i = n_params; i < pos.size(); ++i) varargs.push_back(std::move(pos[i]));
  for (auto& [k, v] : named) {
    const auto it = std::find(n.targets.begin(), n.targets.end(), k);
    if (it == n.targets.end()) {
      if (!n.uses_kwargs) fail(e.line, who + " takes no keyword argument '" + k + "'");
      kwargs[k] = std::move(v);
      continue;
    }
    const size_t i = size_t(it - n.targets.begin());
    if (given[i]) fail(e.line, who + " got multiple values for argument '" + k + "'");
    bound[i] = std::move(v);
    given[i] = true;
  }
  MacroFrame frame(scopes_, floor_, macro_depth_);
  auto& scope = scopes_.back();
  // Parameters are bound in order; a default is evaluated in the macro's scope, seeing the
  // parameters before it. A missing argument without a default is undefined.
  for (size_t i = 0; i < n_params; ++i) {
    if (!given[i] && n.defaults[i]) bound[i] = eval(*n.defaults[i]);
    scopes_.back()[n.targets[i]] = std::move(bound[i]);
  }
  if (n.uses_varargs) scope["varargs"] = std::move(varargs);
  if (n.uses_kwargs) scope["kwargs"] = std::move(kwargs);
  std::string out;
  LoopControl lc;
  exec(n.body, out, lc);
  charge(out.size(), e.line);
  return Value(std::move(out));
}

// transformers' strftime_now(format): datetime.now().strftime(format), local time.
Value Evaluator::strftime_now(const std::vector<Value>& a, int line) {
  if (a.size() != 1 || !a[0].is_string()) fail(line, "strftime_now() needs one string argument");
  const std::string& format = a[0].get_ref<const std::string&>();
  if (format.size() > 256) fail(line, "strftime_now() format longer than the limit of 256 bytes");
  if (format.empty()) return Value("");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (!localtime_r(&now, &local)) fail(line, "strftime_now(): the local time is unavailable");
  char buf[4096];
  const size_t len = std::strftime(buf, sizeof buf, format.c_str(), &local);
  if (len == 0) fail(line, "strftime_now('" + format + "') gives no text or more than 4095 bytes");
  return Value(std::string(buf, len));
}

}  // namespace moestream::jinja
