#include "text/jinja/parser.hpp"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "text/jinja/lexer.hpp"

namespace fp4moe::text::jinja {

namespace {

constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Template run() {
    Template tpl;
    std::string end;
    tpl.body = parse_body({}, &end);
    return tpl;
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().value == n; }
  [[noreturn]] void error(const std::string& msg) const { fail(fmt::format("line {}: {}", cur().line, msg)); }
  std::string describe() const {
    switch (cur().type) {
      case Tok::Data: return "template data";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::End: return "end of template";
      default: return "'" + cur().value + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) error(fmt::format("expected '{}', got {}", op, describe()));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(fmt::format("expected a name, got {}", describe()));
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error(fmt::format("expected end of statement block, got {}", describe()));
    next();
  }
  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  struct DepthGuard {
    int& d;
    DepthGuard(int& depth, const Parser& p) : d(depth) {
      if (++d > kMaxDepth) p.error("template nested too deeply");
    }
    ~DepthGuard() { --d; }
  };

  // ---- statements ----
  // Parses nodes until "{% <one of end_tags>"; consumes "{%" and the tag name.
  Body parse_body(const std::vector<std::string>& end_tags, std::string* which) {
    DepthGuard g(depth_, *this);
    Body body;
    while (true) {
      const Token& tok = cur();
      if (tok.type == Tok::End) {
        if (!end_tags.empty()) error(fmt::format("unexpected end of template, expected '{}'", end_tags.back()));
        return body;
      }
      if (tok.type == Tok::Data) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->line = tok.line;
        n->text = tok.value;
        body.push_back(std::move(n));
        next();
        continue;
      }
      if (tok.type == Tok::VarBegin) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->line = tok.line;
        next();
        n->expr = parse_tuple(false, true, {}, false);
        if (cur().type != Tok::VarEnd) error(fmt::format("expected end of print statement, got {}", describe()));
        next();
        body.push_back(std::move(n));
        continue;
      }
      if (tok.type != Tok::BlockBegin) error(fmt::format("unexpected {}", describe()));
      next();
      if (cur().type != Tok::Name) error("expected a tag name after '{%'");
      const std::string tag = cur().value;
      for (const std::string& e : end_tags) {
        if (tag == e) {
          next();
          *which = tag;
          return body;
        }
      }
      body.push_back(parse_statement(tag, end_tags));
    }
  }

  std::unique_ptr<Node> parse_statement(const std::string& tag, const std::vector<std::string>& enclosing) {
    auto n = std::make_unique<Node>();
    n->line = cur().line;
    next();  // the tag name
    std::string which;
    if (tag == "if") {
      n->kind = Node::Kind::If;
      ExprPtr cond = parse_tuple(false, false, {}, false);
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &which);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (which == "elif") {
          cond = parse_tuple(false, false, {}, false);
          expect_block_end();
          continue;
        }
        if (which == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"}, &which);
        }
        expect_block_end();
        return n;
      }
    }
    if (tag == "for") {
      n->kind = Node::Kind::For;
      n->targets = parse_targets({"in"});
      if (!is_name("in")) error(fmt::format("expected 'in', got {}", describe()));
      next();
      n->expr = parse_tuple(false, false, {"recursive"}, false);
      if (is_name("if")) {
        next();
        n->filter = parse_expression(true);
      }
      if (is_name("recursive")) error("recursive loops are not supported");
      expect_block_end();
      ++loop_depth_;
      n->body = parse_body({"endfor", "else"}, &which);
      --loop_depth_;
      if (which == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, &which);
      }
      expect_block_end();
      return n;
    }
    if (tag == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {  // namespace attribute
        next();
        n->kind = Node::Kind::Set;
        n->targets = {first};
        n->ns_attr = expect_name();
        expect_op("=");
        n->expr = parse_tuple(false, true, {}, false);
        expect_block_end();
        return n;
      }
      n->targets = {first};
      while (is_op(",")) {
        next();
        if (cur().type != Tok::Name) break;
        n->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        next();
        n->kind = Node::Kind::Set;
        n->expr = parse_tuple(false, true, {}, false);
        expect_block_end();
        return n;
      }
      if (n->targets.size() != 1) error("a block set assigns one name");
      n->kind = Node::Kind::SetBlock;
      if (is_op("|")) {  // {% set x | filter %}...{% endset %}
        auto placeholder = make(Expr::Kind::Name, n->line);
        placeholder->name = "__set_body__";
        n->filter = parse_filters(std::move(placeholder));
      }
      expect_block_end();
      n->body = parse_body({"endset"}, &which);
      expect_block_end();
      return n;
    }
    if (tag == "macro") {
      n->kind = Node::Kind::Macro;
      n->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!n->params.empty()) expect_op(",");
        if (is_op(")")) break;
        std::string p = expect_name();
        ExprPtr dflt;
        if (is_op("=")) {
          next();
          dflt = parse_expression(true);
        } else if (!n->params.empty() && n->params.back().second) {
          error("non-default argument follows default argument");
        }
        n->params.emplace_back(std::move(p), std::move(dflt));
      }
      next();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      n->body = parse_body({"endmacro"}, &which);
      loop_depth_ = saved;
      if (cur().type == Tok::Name && cur().value == n->text) next();  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(fmt::format("'{}' outside of a loop", tag));
      n->kind = tag == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_block_end();
      return n;
    }
    if (tag == "with") {
      n->kind = Node::Kind::With;
      while (cur().type != Tok::BlockEnd) {
        if (!n->params.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        n->params.emplace_back(std::move(name), parse_expression(true));
      }
      expect_block_end();
      n->body = parse_body({"endwith"}, &which);
      expect_block_end();
      return n;
    }
    if (tag == "generation") {
      n->kind = Node::Kind::Scope;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, &which);
      expect_block_end();
      return n;
    }
    static const char* const kUnsupported[] = {"include", "import", "from", "extends", "block", "call", "filter",
                                              "do", "autoescape", "trans", "pluralize", "raw"};
    for (const char* u : kUnsupported)
      if (tag == u) error(fmt::format("the '{}' tag is not supported", tag));
    if (tag.starts_with("end") || tag == "elif" || tag == "else")
      error(fmt::format("unexpected '{}'{}", tag,
                        enclosing.empty() ? "" : fmt::format(" (the innermost open block expects '{}')", enclosing.back())));
    error(fmt::format("unknown tag '{}'", tag));
  }

  // Names for a for loop: "a", "a, b", "(a, b)".
  std::vector<std::string> parse_targets(const std::vector<std::string>& end_names) {
    std::vector<std::string> out;
    const bool paren = is_op("(");
    if (paren) next();
    while (true) {
      out.push_back(expect_name());
      if (!is_op(",")) break;
      next();
      if (paren && is_op(")")) break;
      bool at_end = false;
      for (const std::string& e : end_names) at_end |= is_name(e);
      if (at_end) break;
    }
    if (paren) expect_op(")");
    return out;
  }

  // ---- expressions ----
  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) return true;
    for (const std::string& e : extra_end)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error(fmt::format("expected an expression, got {}", describe()));
    }
    auto e = make(Expr::Kind::Tuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(depth_, *this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e1 = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      ExprPtr cond = parse_or();
      ExprPtr e3;
      if (is_name("else")) {
        next();
        DepthGuard g(depth_, *this);
        e3 = parse_condexpr();
      }
      auto e = make(Expr::Kind::Cond, line);
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(e1));
      e->args.push_back(std::move(e3));
      e1 = std::move(e);
    }
    return e1;
  }

  ExprPtr binary(Expr::Kind k, int line, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // A left-associative level: operand (op operand)*, ops being keywords or operators.
  ExprPtr left_assoc(Expr::Kind kind, std::initializer_list<std::string_view> ops, bool keywords,
                     ExprPtr (Parser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (true) {
      std::string op;
      for (std::string_view o : ops)
        if (keywords ? is_name(o) : is_op(o)) op = o;
      if (op.empty()) return left;
      const int line = cur().line;
      next();
      left = binary(kind, line, std::move(left), (this->*operand)(), kind == Expr::Kind::Binary ? op : "");
    }
  }

  ExprPtr parse_or() { return left_assoc(Expr::Kind::Or, {"or"}, true, &Parser::parse_and); }
  ExprPtr parse_and() { return left_assoc(Expr::Kind::And, {"and"}, true, &Parser::parse_not); }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = cur().line;
      next();
      DepthGuard g(depth_, *this);
      auto e = make(Expr::Kind::Not, line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                    cur().value == ">" || cur().value == "<=" || cur().value == ">=")) {
        ops.push_back(cur().value);
        next();
      } else if (is_name("in")) {
        ops.push_back("in");
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().value == "in") {
        ops.push_back("notin");
        next();
        next();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::Compare, line);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() { return left_assoc(Expr::Kind::Binary, {"+", "-"}, false, &Parser::parse_concat); }
  ExprPtr parse_concat() { return left_assoc(Expr::Kind::Binary, {"~"}, false, &Parser::parse_math2); }
  ExprPtr parse_math2() { return left_assoc(Expr::Kind::Binary, {"*", "/", "//", "%"}, false, &Parser::parse_pow); }
  ExprPtr parse_pow() { return left_assoc(Expr::Kind::Binary, {"**"}, false, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(depth_, *this);
    const int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool neg = is_op("-");
      next();
      node = make(neg ? Expr::Kind::Neg : Expr::Kind::Pos, line);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    const int line = tok.line;
    if (tok.type == Tok::Name) {
      auto e = make(Expr::Kind::Literal, line);
      if (tok.value == "true" || tok.value == "True") {
        e->literal = true;
      } else if (tok.value == "false" || tok.value == "False") {
        e->literal = false;
      } else if (tok.value == "none" || tok.value == "None") {
        e->literal = nullptr;
      } else {
        e->kind = Expr::Kind::Name;
        e->name = tok.value;
      }
      next();
      return e;
    }
    if (tok.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) {  // adjacent literals concatenate
        s += cur().value;
        next();
      }
      auto e = make(Expr::Kind::Literal, line);
      e->literal = std::move(s);
      return e;
    }
    if (tok.type == Tok::Int) {
      auto e = make(Expr::Kind::Literal, line);
      errno = 0;
      const unsigned long long v = std::strtoull(tok.value.c_str(), nullptr, 10);
      if (errno == ERANGE || v > uint64_t(INT64_MAX)) error("integer literal too large");
      e->literal = int64_t(v);
      next();
      return e;
    }
    if (tok.type == Tok::Float) {
      auto e = make(Expr::Kind::Literal, line);
      e->literal = std::strtod(tok.value.c_str(), nullptr);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(Expr::Kind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(Expr::Kind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    error(fmt::format("unexpected {}", describe()));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filters(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = cur().line;
    if (is_op(".")) {
      next();
      if (cur().type == Tok::Name) {
        auto e = make(Expr::Kind::GetAttr, line);
        e->name = cur().value;
        next();
        e->args.push_back(std::move(node));
        return e;
      }
      if (cur().type != Tok::Int) error("expected name or number after '.'");
      auto e = make(Expr::Kind::GetItem, line);
      e->args.push_back(std::move(node));
      auto idx = make(Expr::Kind::Literal, line);
      idx->literal = int64_t(std::strtoll(cur().value.c_str(), nullptr, 10));
      next();
      e->args.push_back(std::move(idx));
      return e;
    }
    next();  // '['
    std::vector<ExprPtr> parts;
    while (!is_op("]")) {
      if (!parts.empty()) expect_op(",");
      parts.push_back(parse_subscribed());
    }
    next();
    if (parts.size() != 1) error("multi-dimensional subscripts are not supported");
    if (parts[0]->kind == Expr::Kind::Slice) {
      parts[0]->args.insert(parts[0]->args.begin(), std::move(node));
      return std::move(parts[0]);
    }
    auto e = make(Expr::Kind::GetItem, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(parts[0]));
    return e;
  }

  // An index expression or a slice a:b:c (children: start, stop, step; null if omitted).
  ExprPtr parse_subscribed() {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    if (is_op(":")) {
      next();
      args.emplace_back();
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      args.push_back(std::move(e));
    }
    if (is_op(":")) {
      args.emplace_back();
    } else if (!is_op("]") && !is_op(",")) {
      args.push_back(parse_expression(true));
    } else {
      args.emplace_back();
    }
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(","))
        args.push_back(parse_expression(true));
      else
        args.emplace_back();
    } else {
      args.emplace_back();
    }
    auto s = make(Expr::Kind::Slice, line);
    s->args = std::move(args);
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (is_op("|")) {
      next();
      const int line = cur().line;
      std::string name = expect_name();
      if (is_op(".")) error("dotted filter names are not supported");
      if (!is_known_filter(name)) fail(fmt::format("line {}: no filter named '{}'", line, name));
      auto e = make(Expr::Kind::Filter, line);
      e->name = std::move(name);
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = cur().line;
    next();  // 'is'
    bool negated = false;
    if (is_name("not")) {
      negated = true;
      next();
    }
    std::string name = expect_name();
    if (!is_known_test(name)) fail(fmt::format("line {}: no test named '{}'", line, name));
    auto e = make(Expr::Kind::Test, line);
    e->name = std::move(name);
    e->negated = negated;
    e->args.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("you cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Template parse_template(std::string_view source) { return Parser(tokenize(source)).run(); }

}  // namespace fp4moe::text::jinja
