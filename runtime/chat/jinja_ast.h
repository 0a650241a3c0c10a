// Internal to the chat-template interpreter: the syntax tree the parser builds and the evaluator
// walks. Values are nlohmann::ordered_json; `discarded` stands for Jinja's Undefined.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moestream::jinja {

using Value = nlohmann::ordered_json;

struct Expr;
using ExprP = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind { kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary,
                    kCond, kList, kDict };
  Kind kind;
  int line = 0;
  std::string name;          // variable, attribute, filter, test or operator
  Value literal;             // kLiteral
  std::vector<ExprP> args;   // operands; kCall/kFilter/kTest: [callee/subject, positional...]
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;       // `is not`
  int depth = 1;             // height of this subtree, kept under kMaxTemplateExprDepth by the parser
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBlock, kMacro };
  Node(Kind k, int l) : kind(k), line(l) {}
  Kind kind;
  int line = 0;
  std::string text;                        // kText; kMacro: its name
  ExprP expr;                              // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprP, Body>> branches;  // kIf: (condition, body); else has no condition
  std::vector<std::string> targets;        // kFor loop variables; kSet: name [, attribute]; kMacro: parameters
  std::vector<ExprP> defaults;             // kMacro: each parameter's default (null: none)
  bool uses_varargs = false, uses_kwargs = false;  // kMacro: its body reads varargs / kwargs
  ExprP filter;                            // kFor `if` clause
  Body body, else_body;                    // kFor, kSetBlock, kBlock, kMacro
};

struct Template {
  Body body;
};

Template parse(const std::string& source);  // throws ChatTemplateError
std::string render(const Template& t, const Value& context);

// The source as Jinja's lexer reads it (keep_trailing_newline off): \r\n and \r become \n and one
// newline at the end is dropped.
std::string jinja_source_text(const std::string& source);
// Whether `name` is read anywhere in a body (a macro's use of varargs/kwargs); the parser's depth
// limits bound the recursion.
bool mentions(const Body& body, const std::string& name);

}  // namespace moestream::jinja
