// Chat-template parser: splits the source into text and tags with transformers' whitespace rules
// (trim_blocks, lstrip_blocks, `-` markers), then builds the syntax tree by recursive descent.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja_ast.h"

namespace moestream::jinja {

namespace {

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;
  int line;
};

// A piece of the template: literal text, an expression tag or a statement tag.
struct Piece {
  enum class Type { kText, kExpr, kStmt };
  Type type;
  std::string text;
  std::vector<Token> tokens;
  int line;
};

[[noreturn]] void fail(int line, const std::string& msg) {
  throw ChatTemplateError("chat template line " + std::to_string(line) + ": " + msg);
}

int count_lines(const std::string& s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

// Tokens of one tag body, from `pos` up to the closing marker; returns the position after it and
// whether the closer had a `-`.
size_t lex_tag(const std::string& s, size_t pos, const std::string& closer, int& line,
               std::vector<Token>& out, bool& strip_after) {
  static const char* kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
  while (true) {
    if (pos >= s.size()) fail(line, "unterminated tag, expected '" + closer + "'");
    const char c = s[pos];
    if (c == '\n') { ++line; ++pos; continue; }
    if (std::isspace(static_cast<unsigned char>(c))) { ++pos; continue; }
    if (c == '-' && s.compare(pos + 1, closer.size(), closer) == 0) {
      strip_after = true;
      return pos + 1 + closer.size();
    }
    if (s.compare(pos, closer.size(), closer) == 0) {
      strip_after = false;
      return pos + closer.size();
    }
    if (c == '"' || c == '\'') {
      std::string v;
      size_t i = pos + 1;
      for (; i < s.size() && s[i] != c; ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) {
          const char e = s[++i];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            default: v += '\\'; v += e;
          }
        } else {
          if (s[i] == '\n') ++line;
          v += s[i];
        }
      }
      if (i >= s.size()) fail(line, "unterminated string literal");
      out.push_back({Token::Type::kString, v, line});
      pos = i + 1;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t i = pos;
      bool is_float = false;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      if (i + 1 < s.size() && s[i] == '.' && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        is_float = true;
        ++i;
        while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      }
      out.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, s.substr(pos, i - pos), line});
      pos = i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t i = pos;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      out.push_back({Token::Type::kName, s.substr(pos, i - pos), line});
      pos = i;
      continue;
    }
    bool two = false;
    for (const char* op : kTwoCharOps)
      if (s.compare(pos, 2, op) == 0) two = true;
    if (two) {
      out.push_back({Token::Type::kOp, s.substr(pos, 2), line});
      pos += 2;
      continue;
    }
    if (std::string("+-*/%~<>=()[]{}.,:|").find(c) != std::string::npos) {
      out.push_back({Token::Type::kOp, std::string(1, c), line});
      ++pos;
      continue;
    }
    fail(line, std::string("unexpected character '") + c + "'");
  }
}

std::vector<Piece> split_pieces(const std::string& s) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;  // the previous tag ended with `-`: drop leading whitespace
  bool trim_next = false;   // the previous block tag: drop one newline (trim_blocks)
  while (pos <= s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' &&
           s[open + 1] != '%' && s[open + 1] != '#')
      open = s.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= s.size()) open = std::string::npos;
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(s, pos, open == std::string::npos ? s.size() : open);
    size_t text_start = pos;  // where the kept text begins in the source
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      text.erase(0, k);
      text_start += k;
    } else if (trim_next) {
      const size_t k = text.rfind("\r\n", 0) == 0 ? 2 : (!text.empty() && text[0] == '\n') ? 1 : 0;
      text.erase(0, k);
      text_start += k;
    }
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::Type::kText, text, {}, text_line});
      break;
    }
    const char kind = s[open + 1];
    const bool minus = open + 2 < s.size() && s[open + 2] == '-';
    const bool plus = open + 2 < s.size() && s[open + 2] == '+';
    if (minus) {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    } else if (kind != '{' && !plus) {
      // lstrip_blocks, as Jinja's lexer does it: blanks between a line start and a block tag go.
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool line_starting = text_start == 0 || s[text_start - 1] == '\n';
      if (nl != std::string::npos || line_starting) {
        bool blank = true;
        for (size_t k = from; k < text.size(); ++k)
          blank = blank && std::isspace(static_cast<unsigned char>(text[k]));
        if (blank) text.erase(from);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Type::kText, text, {}, text_line});
    size_t body = open + 2 + ((minus || plus) ? 1 : 0);
    strip_next = trim_next = false;
    if (kind == '#') {
      size_t close = s.find("#}", body);
      if (close == std::string::npos) fail(line, "unterminated comment");
      strip_next = close > 0 && s[close - 1] == '-';
      trim_next = true;
      line += count_lines(s, open, close);
      pos = close + 2;
      continue;
    }
    Piece p{kind == '{' ? Piece::Type::kExpr : Piece::Type::kStmt, "", {}, line};
    bool strip_after = false;
    pos = lex_tag(s, body, kind == '{' ? "}}" : "%}", line, p.tokens, strip_after);
    p.tokens.push_back({Token::Type::kEnd, "", line});
    strip_next = strip_after;
    trim_next = kind == '%';
    pieces.push_back(std::move(p));
  }
  return pieces;
}

// Counts one level of recursion for as long as it lives; fails past `limit` (a hostile template
// must get an error, not a stack overflow).
class NestGuard {
 public:
  NestGuard(int& depth, int limit, int line, const char* what) : depth_(depth) {
    if (++depth_ > limit)
      fail(line, std::string(what) + " nest deeper than the limit of " + std::to_string(limit) + " levels");
  }
  ~NestGuard() { --depth_; }
  NestGuard(const NestGuard&) = delete;
  NestGuard& operator=(const NestGuard&) = delete;

 private:
  int& depth_;
};

// Recursive-descent expression parser over one tag's tokens (Jinja's precedence). Both the
// recursion and the height of the tree it builds (a chain `a + b + c ...` grows the tree without
// recursing; evaluating and freeing it recurse) stay under kMaxTemplateExprDepth.
class ExprParser {
 public:
  ExprParser(const std::vector<Token>& t, size_t start = 0) : t_(t), i_(start) {}

  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().type == Token::Type::kOp && peek().text == op; }
  bool at_name(const char* n) const { return peek().type == Token::Type::kName && peek().text == n; }
  bool at_end() const { return peek().type == Token::Type::kEnd; }
  Token next() { return t_[std::min(i_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(peek().line, std::string("expected '") + op + "', got '" + peek().text + "'");
    ++i_;
  }
  std::string expect_name() {
    if (peek().type != Token::Type::kName) fail(peek().line, "expected a name, got '" + peek().text + "'");
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(peek().line, "unexpected '" + peek().text + "'");
  }

  ExprP expr() {  // a if c else b
    NestGuard nest(nesting_, kMaxTemplateExprDepth, peek().line, "expressions");
    ExprP e = or_expr();
    while (at_name("if")) {
      const int line = next().line;
      ExprP cond = or_expr();
      ExprP other = make(Expr::Kind::kLiteral, line);
      other->literal = Value(Value::value_t::discarded);
      if (at_name("else")) {
        next();
        other = expr();
      }
      ExprP c = make(Expr::Kind::kCond, line);
      c->args = {cond, e, other};
      e = seal(c);
    }
    return e;
  }

  ExprP or_expr() { return left_chain(&ExprParser::and_expr, {"or"}); }
  ExprP and_expr() { return left_chain(&ExprParser::not_expr, {"and"}); }
  ExprP not_expr() {
    if (at_name("not")) {
      const int line = next().line;
      NestGuard nest(nesting_, kMaxTemplateExprDepth, line, "expressions");
      ExprP u = make(Expr::Kind::kUnary, line);
      u->name = "not";
      u->args = {not_expr()};
      return seal(u);
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    while (true) {
      if (peek().type == Token::Type::kOp &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">="))) {
        const std::string op = next().text;
        e = binary(op, e, math1());
      } else if (at_name("in")) {
        next();
        e = binary("in", e, math1());
      } else if (at_name("not") && peek(1).type == Token::Type::kName && peek(1).text == "in") {
        next();
        next();
        e = binary("not in", e, math1());
      } else {
        return e;
      }
    }
  }
  ExprP math1() { return left_chain(&ExprParser::concat, {"+", "-"}); }
  ExprP concat() { return left_chain(&ExprParser::math2, {"~"}); }
  ExprP math2() { return left_chain(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprP power() { return left_chain(&ExprParser::unary_with_filter, {"**"}); }
  ExprP unary_with_filter() { return unary(true); }
  ExprP unary(bool with_filter) {
    ExprP e;
    if (at_op("-") || at_op("+")) {
      const Token op = next();
      NestGuard nest(nesting_, kMaxTemplateExprDepth, op.line, "expressions");
      e = make(Expr::Kind::kUnary, op.line);
      e->name = op.text;
      e->args = {unary(false)};
      seal(e);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(e) : e;
  }

  ExprP primary() {
    const Token tok = next();
    switch (tok.type) {
      case Token::Type::kString: {
        ExprP e = literal(Value(tok.text), tok.line);
        while (peek().type == Token::Type::kString) e->literal = e->literal.get<std::string>() + next().text;
        return e;
      }
      case Token::Type::kInt: {
        std::string digits;
        for (char c : tok.text) if (c != '_') digits += c;
        errno = 0;
        const long long v = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(tok.line, "integer literal " + tok.text + " is outside the 64-bit range");
        return literal(Value(int64_t(v)), tok.line);
      }
      case Token::Type::kFloat: return literal(Value(std::strtod(tok.text.c_str(), nullptr)), tok.line);
      case Token::Type::kName: {
        if (tok.text == "true" || tok.text == "True") return literal(Value(true), tok.line);
        if (tok.text == "false" || tok.text == "False") return literal(Value(false), tok.line);
        if (tok.text == "none" || tok.text == "None") return literal(Value(nullptr), tok.line);
        ExprP e = make(Expr::Kind::kName, tok.line);
        e->name = tok.text;
        return e;
      }
      case Token::Type::kOp:
        if (tok.text == "(") {
          ExprP e = expr();
          if (at_op(",")) fail(tok.line, "tuples are not supported");
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          ExprP e = make(Expr::Kind::kList, tok.line);
          while (!at_op("]")) {
            e->args.push_back(expr());
            if (!at_op("]")) expect_op(",");
          }
          next();
          return seal(e);
        }
        if (tok.text == "{") {
          ExprP e = make(Expr::Kind::kDict, tok.line);
          while (!at_op("}")) {
            e->args.push_back(expr());
            expect_op(":");
            e->args.push_back(expr());
            if (!at_op("}")) expect_op(",");
          }
          next();
          return seal(e);
        }
        break;
      case Token::Type::kEnd: fail(tok.line, "unexpected end of tag");
    }
    fail(tok.line, "unexpected '" + tok.text + "'");
  }

  ExprP postfix(ExprP e) {
    while (true) {
      if (at_op(".")) {
        e = named_after_op(Expr::Kind::kAttr, e);
      } else if (at_op("[")) {
        const int line = next().line;
        ExprP parts[3];
        int n_colons = 0;
        while (!at_op("]")) {
          if (at_op(":")) {
            if (++n_colons > 2) fail(line, "too many ':' in a slice");
            next();
            continue;
          }
          parts[n_colons] = expr();
        }
        next();
        if (n_colons == 0) {
          if (!parts[0]) fail(line, "empty subscript");
          ExprP s = make(Expr::Kind::kItem, line);
          s->args = {e, parts[0]};
          e = seal(s);
        } else {
          ExprP s = make(Expr::Kind::kSlice, line);
          s->args = {e, parts[0], parts[1], parts[2]};
          e = seal(s);
        }
      } else if (at_op("(")) {
        ExprP c = make(Expr::Kind::kCall, peek().line);
        c->args = {e};
        call_args(*c);
        e = seal(c);
      } else {
        return e;
      }
    }
  }

  void call_args(Expr& c) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().type == Token::Type::kName && peek(1).type == Token::Type::kOp && peek(1).text == "=") {
        std::string k = next().text;
        next();
        c.kwargs.emplace_back(k, expr());
      } else {
        c.args.push_back(expr());
      }
      if (!at_op(")")) expect_op(",");
    }
    next();
  }

  ExprP filters(ExprP e) {
    while (true) {
      if (at_op("|")) {
        ExprP f = named_after_op(Expr::Kind::kFilter, e);
        if (at_op("(")) call_args(*f);
        e = seal(f);
      } else if (at_name("is")) {
        const int line = next().line;
        ExprP t = make(Expr::Kind::kTest, line);
        if (at_name("not")) {
          next();
          t->negate = true;
        }
        t->name = expect_name();
        t->args = {e};
        if (at_op("(")) {
          call_args(*t);
        } else if (peek().type == Token::Type::kString || peek().type == Token::Type::kInt ||
                   peek().type == Token::Type::kFloat) {
          t->args.push_back(primary());  // `is divisibleby 3`, `is equalto 'x'`
        }
        e = seal(t);
      } else {
        return e;
      }
    }
  }

  size_t pos() const { return i_; }

 private:
  ExprP make(Expr::Kind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  // Sets the height of a node whose children are complete; refuses one past the limit.
  ExprP seal(const ExprP& e) {
    int below = 0;
    for (const auto& a : e->args)
      if (a) below = std::max(below, a->depth);
    for (const auto& kw : e->kwargs) below = std::max(below, kw.second->depth);
    e->depth = below + 1;
    if (e->depth > kMaxTemplateExprDepth)
      fail(e->line, "expressions nest deeper than the limit of " + std::to_string(kMaxTemplateExprDepth) +
                        " levels (operators, filters, subscripts and brackets each add one)");
    return e;
  }
  ExprP literal(Value v, int line) {
    ExprP e = make(Expr::Kind::kLiteral, line);
    e->literal = std::move(v);
    return e;
  }
  // `operand (op operand)*` for the operators `ops` of one precedence level (words like "or" or
  // symbols), grouped to the left: a - b - c is (a - b) - c.
  ExprP left_chain(ExprP (ExprParser::*operand)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*operand)();
    while (std::any_of(ops.begin(), ops.end(), [&](const char* op) { return at_op(op) || at_name(op); })) {
      const std::string op = next().text;
      e = binary(op, e, (this->*operand)());
    }
    return e;
  }

  // `e . name` or `e | name`: consumes the operator and the name; e is the node's first argument.
  ExprP named_after_op(Expr::Kind kind, ExprP e) {
    const int line = next().line;
    ExprP n = make(kind, line);
    n->name = expect_name();
    n->args = {std::move(e)};
    return seal(n);
  }

  ExprP binary(const std::string& op, ExprP a, ExprP b) {
    ExprP e = make(Expr::Kind::kBinary, a->line);
    e->name = op;
    e->args = {std::move(a), std::move(b)};
    return seal(e);
  }

  const std::vector<Token>& t_;
  size_t i_;
  int nesting_ = 0;  // live recursive calls, under kMaxTemplateExprDepth
};

// Builds bodies from the piece list; stops at a statement whose keyword is in `until`.
class BodyParser {
 public:
  explicit BodyParser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse_all() {
    std::string stop;
    Body b = body({}, stop);
    if (!stop.empty()) fail(p_[i_ - 1].line, "unexpected '" + stop + "'");
    return b;
  }

 private:
  static std::string keyword(const Piece& p) {
    return p.tokens.empty() || p.tokens[0].type != Token::Type::kName ? "" : p.tokens[0].text;
  }

  Body body(const std::vector<std::string>& until, std::string& stopped_at) {
    Body out;
    stopped_at.clear();
    while (i_ < p_.size()) {
      const Piece& p = p_[i_++];
      if (p.type == Piece::Type::kText) {
        Node n{Node::Kind::kText, p.line};
        n.text = p.text;
        out.push_back(std::move(n));
        continue;
      }
      if (p.type == Piece::Type::kExpr) {
        ExprParser ep(p.tokens);
        Node n{Node::Kind::kOutput, p.line};
        n.expr = ep.expr();
        ep.expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string kw = keyword(p);
      for (const auto& u : until)
        if (kw == u) {
          stopped_at = kw;
          return out;
        }
      out.push_back(statement(p, kw));
    }
    if (!until.empty()) fail(p_.empty() ? 1 : p_.back().line, "missing '{% " + until.back() + " %}'");
    return out;
  }

  Node statement(const Piece& p, const std::string& kw) {
    NestGuard nest(block_depth_, kMaxTemplateBlockDepth, p.line, "blocks (if, for, set, macro, generation)");
    ExprParser ep(p.tokens, 1);
    std::string stop;
    if (kw == "if") {
      Node n{Node::Kind::kIf, p.line};
      ExprP cond = ep.expr();
      ep.expect_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, stop);
        n.branches.emplace_back(cond, std::move(b));
        const Piece& q = p_[i_ - 1];
        if (stop == "endif") break;
        if (stop == "else") {
          Body e = body({"endif"}, stop);
          n.branches.emplace_back(nullptr, std::move(e));
          break;
        }
        ExprParser cp(q.tokens, 1);
        cond = cp.expr();
        cp.expect_end();
      }
      return n;
    }
    if (kw == "for") {
      Node n{Node::Kind::kFor, p.line};
      n.targets.push_back(ep.expect_name());
      while (ep.at_op(",")) {
        ep.next();
        n.targets.push_back(ep.expect_name());
      }
      if (!ep.at_name("in")) fail(p.line, "expected 'in' in for");
      ep.next();
      n.expr = ep.or_expr();  // `if` after the iterable filters, it is not a conditional expression
      n.expr = ep.filters(n.expr);
      if (ep.at_name("if")) {
        ep.next();
        n.filter = ep.expr();
      }
      if (ep.at_name("recursive")) fail(p.line, "recursive loops are not supported");
      ep.expect_end();
      n.body = body({"else", "endfor"}, stop);
      if (stop == "else") n.else_body = body({"endfor"}, stop);
      return n;
    }
    if (kw == "set") {
      std::vector<std::string> target{ep.expect_name()};
      if (ep.at_op(".")) {
        ep.next();
        target.push_back(ep.expect_name());
      }
      if (ep.at_op(",")) fail(p.line, "tuple assignment is not supported");
      if (ep.at_end()) {
        Node n{Node::Kind::kSetBlock, p.line};
        n.targets = target;
        n.body = body({"endset"}, stop);
        return n;
      }
      ep.expect_op("=");
      Node n{Node::Kind::kSet, p.line};
      n.targets = target;
      n.expr = ep.expr();
      ep.expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      ep.expect_end();
      return Node{kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, p.line};
    }
    if (kw == "macro") {  // {% macro name(a, b=default, ...) %} ... {% endmacro %}
      Node n{Node::Kind::kMacro, p.line};
      n.text = ep.expect_name();
      ep.expect_op("(");
      while (!ep.at_op(")")) {
        n.targets.push_back(ep.expect_name());
        ExprP def;
        if (ep.at_op("=")) {
          ep.next();
          def = ep.expr();
        } else if (!n.defaults.empty() && n.defaults.back()) {
          fail(p.line, "macro '" + n.text + "': non-default argument follows default argument");
        }
        n.defaults.push_back(def);
        if (!ep.at_op(")")) ep.expect_op(",");
      }
      ep.next();
      ep.expect_end();
      n.body = body({"endmacro"}, stop);
      // As in Jinja, a macro takes extra arguments only when its body reads varargs / kwargs.
      n.uses_varargs = mentions(n.body, "varargs");
      n.uses_kwargs = mentions(n.body, "kwargs");
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body
      Node n{Node::Kind::kBlock, p.line};
      n.body = body({"endgeneration"}, stop);
      return n;
    }
    fail(p.line, "unsupported tag '" + kw + "'");
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  int block_depth_ = 0;  // statements being parsed, one inside the other
};

}  // namespace

Template parse(const std::string& source) {
  if (source.size() > kMaxTemplateBytes)
    fail(1, "the template has " + std::to_string(source.size()) + " bytes, over the limit of " +
                std::to_string(kMaxTemplateBytes) + " bytes");
  BodyParser bp(split_pieces(jinja_source_text(source)));
  return Template{bp.parse_all()};
}

}  // namespace moestream::jinja
