// Chat-template evaluator: walks the syntax tree with Python/Jinja semantics for truthiness,
// printing (str()), operators and loop variables (calls: jinja_calls.cpp; filters and tests:
// jinja_filters.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_evaluator.h"

namespace moestream::jinja {

Evaluator::Evaluator(const Value& ctx) {
  scopes_.emplace_back();
  for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_.back()[it.key()] = it.value();
}

std::string Evaluator::run(const Body& b) {
  std::string out;
  loop_iterations_ = 0;
  work_bytes_ = 0;
  macro_calls_ = 0;
  macros_.clear();
  LoopControl lc;
  exec(b, out, lc);
  return out;
}

Value* Evaluator::find(const std::string& name) {
  // Inside a macro only its own scopes and the template's top level are visible (the caller's
  // loop variables and local sets are not), as in Jinja.
  for (size_t i = scopes_.size(); i-- > floor_;) {
    auto f = scopes_[i].find(name);
    if (f != scopes_[i].end()) return &f->second;
  }
  if (floor_ > 0) {
    auto f = scopes_[0].find(name);
    if (f != scopes_[0].end()) return &f->second;
  }
  return nullptr;
}

void Evaluator::exec(const Body& body, std::string& out, LoopControl& lc) {
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
      case Node::Kind::kMacro:
        scopes_.back()[n.text] = make_macro(macros_.size(), n.text);
        macros_.push_back(&n);
        break;
    }
  }
  if (!body.empty()) check_bytes(out.size(), body.back().line, "the rendered text");
}

void Evaluator::assign(const Node& n, Value v) {
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

Value Evaluator::iterable_items(const Value& v, int line) {
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

void Evaluator::bind_targets(const Node& n, const Value& item, std::map<std::string, Value>& scope) {
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
void Evaluator::charge(size_t bytes, int line) {
  work_bytes_ += bytes;
  if (work_bytes_ > kMaxTemplateWorkBytes)
    fail(line, "the rendering copies or builds more than the limit of " +
                   std::to_string(kMaxTemplateWorkBytes >> 30) + " GiB of values (a loop over large values?)");
}

Value Evaluator::built(std::string s, int line) {
  charge(s.size(), line);
  return Value(std::move(s));
}

// Loops are the only way a template's work can grow beyond its size times its inputs' size.
void Evaluator::count_iteration(int line) {
  if (++loop_iterations_ > kMaxTemplateLoopIterations)
    fail(line, "more than the limit of " + std::to_string(kMaxTemplateLoopIterations) +
                   " loop iterations in one rendering");
}

void Evaluator::exec_for(const Node& n, std::string& out, LoopControl& outer) {
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

Value Evaluator::eval(const Expr& e) {
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

Value Evaluator::get_item(const Value& obj, const Value& key, int line, bool attr) {
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

Value Evaluator::slice(const Expr& e) {
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

std::vector<Value> Evaluator::eval_args(const Expr& e, size_t from) {
  std::vector<Value> out;
  for (size_t i = from; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
  return out;
}

Value Evaluator::kwarg(const Expr& e, const std::string& name) {
  for (const auto& [k, v] : e.kwargs)
    if (k == name) return eval(*v);
  return undefined();
}

bool Evaluator::contains(const Value& hay, const Value& needle, int line) {
  if (hay.is_string()) {
    if (!needle.is_string()) fail(line, "'in <string>' needs a string on the left");
    return hay.get_ref<const std::string&>().find(needle.get_ref<const std::string&>()) != std::string::npos;
  }
  if (hay.is_array()) return std::find(hay.begin(), hay.end(), needle) != hay.end();
  if (hay.is_object()) return needle.is_string() && hay.contains(needle.get<std::string>());
  fail(line, std::string("argument of type ") + type_name(hay) + " is not iterable");
}

Value Evaluator::binary(const Expr& e) {
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

std::string render(const Template& t, const Value& context) {
  if (!context.is_object()) throw ChatTemplateError("chat template context must be a JSON object");
  for (auto it = context.begin(); it != context.end(); ++it) check_template_input(it.value(), it.key());
  return Evaluator(context).run(t.body);
}

}  // namespace moestream::jinja
