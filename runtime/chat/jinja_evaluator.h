// Internal to the chat-template interpreter: the evaluator that walks the syntax tree. Its
// methods are split by topic: jinja_eval.cpp (statements, expressions, operators), jinja_calls.cpp
// (function, method and macro calls), jinja_filters.cpp (filters and tests).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/chat/jinja_ast.h"
#include "runtime/chat/jinja_value.h"

namespace moestream::jinja {

struct LoopControl {
  enum class Kind { kNone, kBreak, kContinue } kind = Kind::kNone;
};

class Evaluator {
 public:
  explicit Evaluator(const Value& ctx);

  std::string run(const Body& b);

 private:
  Value* find(const std::string& name);

  void exec(const Body& body, std::string& out, LoopControl& lc);

  void assign(const Node& n, Value v);

  Value iterable_items(const Value& v, int line);

  void bind_targets(const Node& n, const Value& item, std::map<std::string, Value>& scope);

  // Bytes copied by variable lookups and built by operators, against kMaxTemplateWorkBytes: a
  // loop that copies a large value each time would otherwise run for hours within every other limit.
  void charge(size_t bytes, int line);
  Value built(std::string s, int line);

  // Loops are the only way a template's work can grow beyond its size times its inputs' size.
  void count_iteration(int line);

  void exec_for(const Node& n, std::string& out, LoopControl& outer);

  Value eval(const Expr& e);

  Value get_item(const Value& obj, const Value& key, int line, bool attr);

  Value slice(const Expr& e);

  std::vector<Value> eval_args(const Expr& e, size_t from);
  Value kwarg(const Expr& e, const std::string& name);
  // Positional argument i, else keyword `name`, else undefined.
  static Value arg(const std::vector<Value>& pos, size_t i) { return i < pos.size() ? pos[i] : undefined(); }

  Value call(const Expr& e);
  // Calls macro m with positional arguments `pos` and the keyword arguments of call expression e.
  Value call_macro(const Value& m, std::vector<Value> pos, const Expr& e);
  Value strftime_now(const std::vector<Value>& a, int line);

  Value filter(const Expr& e);

  bool apply_test(const std::string& t, const Value& v, const std::vector<Value>& a, int line);

  bool test(const Expr& e);

  bool contains(const Value& hay, const Value& needle, int line);

  Value binary(const Expr& e);

  std::vector<std::map<std::string, Value>> scopes_;
  size_t floor_ = 0;                    // first scope of the running macro call (0: none)
  std::vector<const Node*> macros_;     // defined so far in this rendering; a macro value indexes it
  int macro_depth_ = 0;                 // nested macro calls, under kMaxTemplateMacroDepth
  int64_t macro_calls_ = 0;             // in this rendering, under kMaxTemplateMacroCalls
  int64_t loop_iterations_ = 0;  // in this rendering, under kMaxTemplateLoopIterations
  size_t work_bytes_ = 0;        // in this rendering, under kMaxTemplateWorkBytes
};

}  // namespace moestream::jinja
