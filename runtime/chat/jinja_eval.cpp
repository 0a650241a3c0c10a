// Chat-template evaluator: walks the syntax tree with Python/Jinja semantics for truthiness,
// printing (str()), operators, loop variables, filters, tests and string/dict methods.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_ast.h"
#include "runtime/chat/jinja_value.h"

namespace moestream::jinja {

namespace {
struct LoopControl {
  enum class Kind { kNone, kBreak, kContinue } kind = Kind::kNone;
};

class Evaluator {
 public:
  explicit Evaluator(const Value& ctx) {
    scopes_.emplace_back();
    for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_.back()[it.key()] = it.value();
  }

  std::string run(const Body& b) {
    std::string out;
    loop_iterations_ = 0;
    work_bytes_ = 0;
    LoopControl lc;
    exec(b, out, lc);
    return out;
  }

 private:
  Value* find(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  void exec(const Body& body, std::string& out, LoopControl& lc) {
    for (const Node& n : body) {
      if (lc.kind != LoopControl::Kind::kNone) return;
      check_bytes(out.size(), n.line, "the rendered text");
      switch (n.kind) {
        case Node::Kind::kText: out += n.text; break;
        case Node::Kind::kOutput: {
          const std::string text = py_str(eval(*n.expr));
          charge(text.size(), n.line);
          out += text;
          break;
        }
        case Node::Kind::kBlock: exec(n.body, out, lc); break;
        case Node::Kind::kIf:
          for (const auto& [cond, b] : n.branches)
            if (!cond || truthy(eval(*cond))) {
              exec(b, out, lc);
              break;
            }
          break;
        case Node::Kind::kFor: exec_for(n, out, lc); break;
        case Node::Kind::kSet: assign(n, eval(*n.expr)); break;
        case Node::Kind::kSetBlock: {
          std::string captured;
          LoopControl inner;
          exec(n.body, captured, inner);
          assign(n, Value(captured));
          break;
        }
        case Node::Kind::kBreak: lc.kind = LoopControl::Kind::kBreak; return;
        case Node::Kind::kContinue: lc.kind = LoopControl::Kind::kContinue; return;
      }
    }
    if (!body.empty()) check_bytes(out.size(), body.back().line, "the rendered text");
  }

  void assign(const Node& n, Value v) {
    // Bounds what a loop can build up step by step (`set ns.x = [ns.x]`); copies recurse.
    if (nests_deeper(v, kMaxTemplateValueDepth))
      fail(n.line, "set " + n.targets.back() + ": the value nests deeper than the limit of " +
                       std::to_string(kMaxTemplateValueDepth) + " levels of lists and dicts");
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return;
    }
    Value* obj = find(n.targets[0]);
    if (!obj || !obj->is_object() || !obj->contains("__namespace__"))
      fail(n.line, "'" + n.targets[0] + "' is not a namespace: cannot set ." + n.targets[1]);
    (*obj)[n.targets[1]] = std::move(v);
  }

  Value iterable_items(const Value& v, int line) {
    if (v.is_array()) return v;
    if (v.is_object()) {
      Value keys = Value::array();
      for (auto it = v.begin(); it != v.end(); ++it)
        if (it.key() != "__namespace__") keys.push_back(it.key());
      return keys;
    }
    if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      if (s.size() > kMaxTemplateListItems)
        fail(line, "a string of " + std::to_string(s.size()) + " characters is too long to iterate (the limit of " +
                       std::to_string(kMaxTemplateListItems) + " list items)");
      Value chars = Value::array();
      for (char c : s) chars.push_back(std::string(1, c));
      return chars;
    }
    if (is_undef(v)) return Value::array();  // Jinja iterates an Undefined as empty
    fail(line, std::string("cannot iterate over ") + type_name(v));
  }

  void bind_targets(const Node& n, const Value& item, std::map<std::string, Value>& scope) {
    if (n.targets.size() == 1) {
      scope[n.targets[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.targets.size())
      fail(n.line, "cannot unpack " + std::string(type_name(item)) + " into " +
                       std::to_string(n.targets.size()) + " loop variables");
    for (size_t i = 0; i < n.targets.size(); ++i) scope[n.targets[i]] = item[i];
  }

  // Bytes copied by variable lookups and built by operators, against kMaxTemplateWorkBytes: a
  // loop that copies a large value each time would otherwise run for hours within every other limit.
  void charge(size_t bytes, int line) {
    work_bytes_ += bytes;
    if (work_bytes_ > kMaxTemplateWorkBytes)
      fail(line, "the rendering copies or builds more than the limit of " +
                     std::to_string(kMaxTemplateWorkBytes >> 30) + " GiB of values (a loop over large values?)");
  }
  Value built(std::string s, int line) {
    charge(s.size(), line);
    return Value(std::move(s));
  }

  // Loops are the only way a template's work can grow beyond its size times its inputs' size.
  void count_iteration(int line) {
    if (++loop_iterations_ > kMaxTemplateLoopIterations)
      fail(line, "more than the limit of " + std::to_string(kMaxTemplateLoopIterations) +
                     " loop iterations in one rendering");
  }

  void exec_for(const Node& n, std::string& out, LoopControl& outer) {
    const Value all = iterable_items(eval(*n.expr), n.line);
    std::vector<Value> items;
    for (const auto& item : all) {
      if (n.filter) {
        count_iteration(n.line);
        scopes_.emplace_back();
        bind_targets(n, item, scopes_.back());
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (!keep) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) {
      exec(n.else_body, out, outer);
      return;
    }
    const int64_t len = int64_t(items.size());
    for (int64_t i = 0; i < len; ++i) {
      count_iteration(n.line);
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      bind_targets(n, items[size_t(i)], scope);
      Value loop = Value::object();
      loop["index"] = i + 1;
      loop["index0"] = i;
      loop["revindex"] = len - i;
      loop["revindex0"] = len - i - 1;
      loop["first"] = i == 0;
      loop["last"] = i + 1 == len;
      loop["length"] = len;
      loop["previtem"] = i > 0 ? items[size_t(i - 1)] : undefined();
      loop["nextitem"] = i + 1 < len ? items[size_t(i + 1)] : undefined();
      scope["loop"] = std::move(loop);
      LoopControl lc;
      exec(n.body, out, lc);
      scopes_.pop_back();
      if (lc.kind == LoopControl::Kind::kBreak) break;
    }
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: {
        const Value* v = find(e.name);
        if (!v) return undefined();
        charge(v->is_string() ? v->get_ref<const std::string&>().size()
                              : approx_bytes(*v, kMaxTemplateWorkBytes), e.line);  // the copy below
        return *v;
      }
      case Expr::Kind::kAttr: return get_item(eval(*e.args[0]), Value(e.name), e.line, true);
      case Expr::Kind::kItem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line, false);
      case Expr::Kind::kSlice: return slice(e);
      case Expr::Kind::kCall: return call(e);
      case Expr::Kind::kFilter: return filter(e);
      case Expr::Kind::kTest: {
        const bool r = test(e);
        return Value(e.negate ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value(!truthy(v));
        if (v.is_number_integer()) {
          const int64_t x = v.get<int64_t>();
          if (e.name == "-" && x == std::numeric_limits<int64_t>::min())
            fail(e.line, "integer overflow: -(" + std::to_string(x) + ") is outside the 64-bit range");
          return Value(e.name == "-" ? -x : x);
        }
        if (v.is_number()) return Value(e.name == "-" ? -v.get<double>() : v.get<double>());
        fail(e.line, "bad operand type for unary " + e.name + ": " + type_name(v));
      }
      case Expr::Kind::kBinary: return binary(e);
      case Expr::Kind::kCond:
        return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::Kind::kList: {
        Value out = Value::array();
        size_t bytes = 0;
        for (const auto& a : e.args) {
          out.push_back(eval(*a));
          bytes += approx_bytes(out.back(), kMaxTemplateValueBytes);
          check_bytes(bytes, e.line, "the list");
        }
        charge(bytes, e.line);
        return out;
      }
      case Expr::Kind::kDict: {
        Value out = Value::object();
        size_t bytes = 0;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(e.line, "dict keys must be strings");
          Value& slot = out[k.get<std::string>()];
          slot = eval(*e.args[i + 1]);
          bytes += approx_bytes(slot, kMaxTemplateValueBytes);
          check_bytes(bytes, e.line, "the dict");
        }
        charge(bytes, e.line);
        return out;
      }
    }
    fail(e.line, "unknown expression");
  }

  Value get_item(const Value& obj, const Value& key, int line, bool attr) {
    if (is_undef(obj)) return undefined();  // lenient: an attribute of Undefined is Undefined
    if (obj.is_object()) {
      if (!key.is_string()) return undefined();
      auto it = obj.find(key.get<std::string>());
      return it == obj.end() ? undefined() : *it;
    }
    if ((obj.is_array() || obj.is_string()) && key.is_number_integer()) {
      const int64_t n = obj.is_array() ? int64_t(obj.size()) : int64_t(obj.get_ref<const std::string&>().size());
      int64_t i = key.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return undefined();
      if (obj.is_array()) return obj[size_t(i)];
      return Value(std::string(1, obj.get_ref<const std::string&>()[size_t(i)]));
    }
    return undefined();
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    int64_t step = e.args[3] ? as_int(eval(*e.args[3]), e.line, "slice step") : 1;
    if (step == 0) fail(e.line, "slice step cannot be zero");
    if (!obj.is_array() && !obj.is_string()) fail(e.line, std::string("cannot slice ") + type_name(obj));
    const int64_t n = obj.is_array() ? int64_t(obj.size()) : int64_t(obj.get_ref<const std::string&>().size());
    int64_t start, stop;
    if (step > 0) {
      start = e.args[1] ? clamp_index(as_int(eval(*e.args[1]), e.line, "slice start"), n, false) : 0;
      stop = e.args[2] ? clamp_index(as_int(eval(*e.args[2]), e.line, "slice stop"), n, false) : n;
    } else {
      start = e.args[1] ? clamp_index(as_int(eval(*e.args[1]), e.line, "slice start"), n, true) : n - 1;
      stop = e.args[2] ? clamp_index(as_int(eval(*e.args[2]), e.line, "slice stop"), n, true) : -1;
    }
    Value arr = Value::array();
    std::string str;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (obj.is_array()) arr.push_back(obj[size_t(i)]);
      else str += obj.get_ref<const std::string&>()[size_t(i)];
      if (__builtin_add_overflow(i, step, &i)) break;  // a huge step: past the end either way
    }
    return obj.is_array() ? arr : Value(str);
  }

  std::vector<Value> eval_args(const Expr& e, size_t from) {
    std::vector<Value> out;
    for (size_t i = from; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }
  Value kwarg(const Expr& e, const std::string& name) {
    for (const auto& [k, v] : e.kwargs)
      if (k == name) return eval(*v);
    return undefined();
  }
  // Positional argument i, else keyword `name`, else undefined.
  static Value arg(const std::vector<Value>& pos, size_t i) { return i < pos.size() ? pos[i] : undefined(); }

  Value call(const Expr& e) {
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

  Value filter(const Expr& e) {
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

  bool apply_test(const std::string& t, const Value& v, const std::vector<Value>& a, int line) {
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
    if (t == "callable") return false;
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

  bool test(const Expr& e) {
    return apply_test(e.name, eval(*e.args[0]), eval_args(e, 1), e.line);
  }

  bool contains(const Value& hay, const Value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) fail(line, "'in <string>' needs a string on the left");
      return hay.get_ref<const std::string&>().find(needle.get_ref<const std::string&>()) != std::string::npos;
    }
    if (hay.is_array()) return std::find(hay.begin(), hay.end(), needle) != hay.end();
    if (hay.is_object()) return needle.is_string() && hay.contains(needle.get<std::string>());
    fail(line, std::string("argument of type ") + type_name(hay) + " is not iterable");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? l : eval(*e.args[1]);
    }
    const Value l = eval(*e.args[0]), r = eval(*e.args[1]);
    if (op == "~") {
      std::string a = py_str(l);
      const std::string b = py_str(r);
      check_bytes(a.size() + b.size(), e.line, "the result of ~");
      return built(a + b, e.line);
    }
    if (op == "in") return Value(contains(r, l, e.line));
    if (op == "not in") return Value(!contains(r, l, e.line));
    if (op == "==") return Value(!is_undef(l) && !is_undef(r) ? l == r : is_undef(l) && is_undef(r));
    if (op == "!=") return Value(!(!is_undef(l) && !is_undef(r) ? l == r : is_undef(l) && is_undef(r)));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      const bool ok = (l.is_number() && r.is_number()) || (l.is_string() && r.is_string());
      if (!ok) fail(e.line, "cannot compare " + std::string(type_name(l)) + " and " + type_name(r));
      if (op == "<") return Value(l < r);
      if (op == ">") return Value(l > r);
      if (op == "<=") return Value(l <= r);
      return Value(l >= r);
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        const auto& a = l.get_ref<const std::string&>();
        const auto& b = r.get_ref<const std::string&>();
        check_bytes(a.size() + b.size(), e.line, "the result of +");
        return built(a + b, e.line);
      }
      if (l.is_array() && r.is_array()) {
        if (l.size() + r.size() > kMaxTemplateListItems)
          fail(e.line, "list + list of " + std::to_string(l.size() + r.size()) + " items, over the limit of " +
                           std::to_string(kMaxTemplateListItems));
        const size_t bytes = approx_bytes(l, kMaxTemplateValueBytes) + approx_bytes(r, kMaxTemplateValueBytes);
        check_bytes(bytes, e.line, "the result of list + list");
        charge(bytes, e.line);
        Value out = l;
        for (const auto& x : r) out.push_back(x);
        return out;
      }
    }
    if (op == "*" && l.is_string() && r.is_number_integer()) {
      // Refused, not cut short: a shortened string would be a silently wrong prompt.
      const std::string& unit = l.get_ref<const std::string&>();
      const int64_t times = r.get<int64_t>();
      if (times <= 0 || unit.empty()) return Value("");
      if (uint64_t(times) > kMaxTemplateValueBytes / unit.size())
        fail(e.line, "string repetition of " + std::to_string(unit.size()) + " bytes * " + std::to_string(times) +
                         " would be larger than the limit of " + std::to_string(kMaxTemplateValueBytes >> 20) +
                         " MiB for a template value");
      std::string out;
      out.reserve(unit.size() * size_t(times));
      for (int64_t i = 0; i < times; ++i) out += unit;
      return built(std::move(out), e.line);
    }
    const bool nums = (l.is_number() || l.is_boolean()) && (r.is_number() || r.is_boolean());
    if (!nums) fail(e.line, "unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
    const bool ints = !l.is_number_float() && !r.is_number_float();
    auto num = [](const Value& v) { return v.is_boolean() ? double(v.get<bool>()) : v.get<double>(); };
    auto inum = [](const Value& v) { return v.is_boolean() ? int64_t(v.get<bool>()) : v.get<int64_t>(); };
    if (op == "/") {
      if (num(r) == 0) fail(e.line, "division by zero");
      return Value(num(l) / num(r));
    }
    if (ints) return int_arith(op, inum(l), inum(r), e.line);
    {
      const double x = num(l), y = num(r);
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") return Value(std::pow(x, y));
      if (y == 0) fail(e.line, "division by zero");
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") return Value(x - y * std::floor(x / y));
    }
    fail(e.line, "unknown operator " + op);
  }

  std::vector<std::map<std::string, Value>> scopes_;
  int64_t loop_iterations_ = 0;  // in this rendering, under kMaxTemplateLoopIterations
  size_t work_bytes_ = 0;        // in this rendering, under kMaxTemplateWorkBytes
};

}  // namespace

std::string render(const Template& t, const Value& context) {
  if (!context.is_object()) throw ChatTemplateError("chat template context must be a JSON object");
  for (auto it = context.begin(); it != context.end(); ++it) check_template_input(it.value(), it.key());
  return Evaluator(context).run(t.body);
}

}  // namespace moestream::jinja
