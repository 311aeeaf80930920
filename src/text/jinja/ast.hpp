// The syntax tree of a parsed Jinja template.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

namespace fp4moe::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // literal
    Name,      // name
    GetAttr,   // args[0].name
    GetItem,   // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null children are omitted bounds)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is [not] name(args[1..], kwargs)
    Not,       // not args[0]
    Neg,       // -args[0]
    Pos,       // +args[0]
    Binary,    // args[0] name args[1]: + - * / // % ** ~
    Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    And,       // args[0] and args[1]
    Or,        // args[0] or args[1]
    Cond,      // args[1] if args[0] else args[2] (args[2] may be null)
    List,      // [args...]
    Tuple,     // (args...)
    Dict,      // {args[0]: args[1], args[2]: args[3], ...}
  };
  Kind kind;
  int line = 0;
  std::string name;
  Json literal;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches: (cond, body)...; else_body
    For,       // for targets in expr [if filter]: body; else_body
    Set,       // set targets = expr; or ns.attr = expr (ns_attr non-empty)
    SetBlock,  // set targets[0] %}body{% endset (optional filter chain in expr, applied to a Name "__body")
    Macro,     // macro name(params) body
    Break,
    Continue,
    With,      // with targets = exprs: body
    Scope,     // a body rendered in place ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string ns_attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro params / with assignments
};

struct Template {
  Body body;
};

}  // namespace fp4moe::text::jinja
