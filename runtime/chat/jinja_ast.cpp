// Helpers on the chat-template source and syntax tree for the parser.
#include "runtime/chat/jinja_ast.h"

namespace moestream::jinja {

std::string jinja_source_text(const std::string& source) {
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') {
      text += source[i];
    } else {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

namespace {
bool mentions(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const auto& a : e->args)
    if (mentions(a.get(), name)) return true;
  for (const auto& kw : e->kwargs)
    if (mentions(kw.second.get(), name)) return true;
  return false;
}
}  // namespace

bool mentions(const Body& body, const std::string& name) {
  for (const Node& n : body) {
    if (mentions(n.expr.get(), name) || mentions(n.filter.get(), name) || mentions(n.body, name) ||
        mentions(n.else_body, name))
      return true;
    for (const auto& [cond, b] : n.branches)
      if (mentions(cond.get(), name) || mentions(b, name)) return true;
    for (const auto& d : n.defaults)
      if (mentions(d.get(), name)) return true;
  }
  return false;
}

}  // namespace moestream::jinja
