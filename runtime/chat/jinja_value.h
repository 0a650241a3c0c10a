// Internal to the chat-template interpreter: Python semantics of values (truthiness, str(),
// repr(), json.dumps) and the string helpers shared by methods and filters.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/chat/jinja_ast.h"

namespace moestream::jinja {

[[noreturn]] void fail(int line, const std::string& msg);  // ChatTemplateError naming the line

Value undefined();               // Jinja's Undefined (a discarded JSON value)
bool is_undef(const Value& v);
const char* type_name(const Value& v);
bool truthy(const Value& v);
std::string py_str(const Value& v);   // what {{ v }} prints

// A macro as a template value: a JSON binary (which no JSON text can produce, so input cannot
// forge one) holding the macro's index in the evaluator and its name.
Value make_macro(size_t index, const std::string& name);
bool is_macro(const Value& v);
size_t macro_index(const Value& v);  // v is a macro
std::string macro_name(const Value& v);
std::string py_repr(const Value& v, int depth = 0);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: None), keys in insertion order.
void dumps(const Value& v, int indent, int depth, std::string& out);

// Whether lists/dicts nest more than `limit` levels inside v ([] is 1); iterative.
bool nests_deeper(const Value& v, int limit);
// Rough heap bytes of v (strings, keys, 16 per node), counting stops past `stop_at`; iterative.
size_t approx_bytes(const Value& v, size_t stop_at);
// Fails naming `what` when a value of n bytes would pass kMaxTemplateValueBytes.
void check_bytes(size_t n, int line, const std::string& what);

std::string strip(const std::string& s, const Value* chars, bool left, bool right);
Value split(const std::string& s, const Value* sep);  // Python str.split (sep null: whitespace)
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int line);
std::string title_case(const std::string& s, bool only_first);
// Python's + - * ** // % on integers; a result outside int64 (a big int in Python) fails.
Value int_arith(const std::string& op, int64_t x, int64_t y, int line);
int64_t as_int(const Value& v, int line, const char* what);
// Python's normalisation of a slice bound.
int64_t clamp_index(int64_t i, int64_t n, bool for_stop_neg_step);

}  // namespace moestream::jinja
