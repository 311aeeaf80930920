#include "text/jinja/interpreter.hpp"

#include <unordered_map>

#include <fmt/format.h>

#include "text/jinja/builtins.hpp"

namespace fp4moe::text::jinja {

namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

// Text a template writes (the output, a macro's result, a set block's body): charged to the
// render's budget while it exists and bounded by the output limit.
struct Text {
  std::string s;
  Charge charged;
};

std::string size_text(size_t bytes) {
  return bytes % (size_t(1) << 20) == 0 ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} bytes", bytes);
}

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits)
      : limits_(limits), budget_(std::make_shared<Budget>(limits.max_memory_bytes, limits.max_steps)) {}

  std::string run(const Template& tpl, const std::vector<std::pair<std::string, Value>>& context) {
    const BudgetScope installed(budget_);
    Text out;
    try {
      // The caller's data is not charged, but it is walked by recursive printers and
      // comparisons: its nesting is bounded like that of the values made here.
      for (const auto& [k, v] : context)
        if (v.is_data() && footprint(v.json()).depth > kMaxNesting)
          fail(fmt::format("the variable '{}' is nested deeper than {} levels", k, kMaxNesting));
      auto root = std::make_shared<Scope>();
      for (auto& [k, v] : builtin_globals()) root->vars[k] = v;
      for (const auto& [k, v] : context) root->vars[k] = v;
      exec(tpl.body, root, out);
    } catch (TemplateError& e) {
      if (!e.message.starts_with("line ")) e.message = fmt::format("line {}: {}", line_, e.message);
      throw;
    }
    return std::move(out.s);
  }

 private:
  enum class Flow { Normal, Break, Continue };

  void step() { budget_->steps(1); }
  void write(Text& out, std::string_view s) {
    if (s.size() > limits_.max_output_bytes - out.s.size())
      fail(fmt::format("the template output exceeds {} (the limit on rendered text)",
                       size_text(limits_.max_output_bytes)));
    out.charged.add(s.size());
    out.s += s;
  }

  Flow exec(const Body& body, const ScopePtr& scope, Text& out) {
    for (const auto& n : body) {
      const Flow f = exec_node(*n, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& n, const ScopePtr& scope, Text& out) {
    step();
    line_ = n.line;
    switch (n.kind) {
      case Node::Kind::Text: write(out, n.text); return Flow::Normal;
      case Node::Kind::Output: {
        const Value v = eval(*n.expr, scope);
        if (v.is_string()) {
          write(out, v.str());
        } else {
          write(out, to_str(v));
        }
        return Flow::Normal;
      }
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond, scope))) return exec(body, scope, out);
        return exec(n.else_body, scope, out);
      case Node::Kind::For: return exec_for(n, scope, out);
      case Node::Kind::Set: {
        const Value v = eval(*n.expr, scope);
        if (!n.ns_attr.empty()) {
          const Value* target = scope->find(n.targets[0]);
          if (!target || !target->is_namespace()) fail("cannot assign attribute on non-namespace object");
          target->namespace_obj().set(n.ns_attr, v);
        } else {
          assign(scope, n.targets, v);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        Text text;
        exec(n.body, child(scope), text);
        Value v = Value::string(std::move(text.s));
        if (n.filter) {
          auto tmp = child(scope);
          tmp->vars["__set_body__"] = v;
          v = eval(*n.filter, tmp);
        }
        assign(scope, n.targets, v);
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        std::weak_ptr<Scope> defining = scope;
        const Node* node = &n;
        scope->vars[n.text] = Value::callable("macro '" + n.text + "'", [this, node, defining](CallArgs& a) {
          const ScopePtr s = defining.lock();
          if (!s) fail(fmt::format("macro '{}' called outside the scope it was defined in", node->text));
          return call_macro(*node, s, a);
        });
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::With: {
        auto s = child(scope);
        for (const auto& [name, expr] : n.params) s->vars[name] = eval(*expr, scope);
        return exec(n.body, s, out);
      }
      case Node::Kind::Scope: return exec(n.body, child(scope), out);
    }
    return Flow::Normal;
  }

  void assign(const ScopePtr& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = v;
      return;
    }
    const std::vector<Value> items = iterate(v);
    if (items.size() != targets.size())
      fail(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = items[i];
  }

  Flow exec_for(const Node& n, const ScopePtr& scope, Text& out) {
    std::vector<Value> items = iterate(eval(*n.expr, scope));
    const Charge held(items.size() * kValueBytes);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        auto s = child(scope);
        assign(s, n.targets, item);
        if (truthy(eval(*n.filter, s))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const size_t len = items.size();
    auto state = std::make_shared<LoopState>();
    state->items = std::move(items);
    auto loop = std::make_shared<Namespace>();
    loop->loop = state;
    const Value loop_value = Value::ns(loop);
    ScopePtr s;
    for (size_t i = 0; i < len; ++i) {
      step();
      state->index = i;
      // A fresh scope per iteration (assignments do not survive it); reused when nothing
      // (a macro defined in the body) kept a reference to the previous one.
      if (s && s.use_count() == 1)
        s->vars.clear();
      else
        s = child(scope);
      assign(s, n.targets, state->items[i]);
      s->vars["loop"] = loop_value;
      if (exec(n.body, s, out) == Flow::Break) break;
    }
    if (len == 0) return exec(n.else_body, scope, out);
    return Flow::Normal;
  }

  Value call_macro(const Node& m, const ScopePtr& defining, CallArgs& a) {
    step();
    if (++depth_ > limits_.max_call_depth) fail(fmt::format("macro calls nested deeper than {}", limits_.max_call_depth));
    struct Exit {
      int& d;
      ~Exit() { --d; }
    } exit{depth_};
    const int saved_line = line_;
    if (a.positional.size() > m.params.size())
      fail(fmt::format("macro '{}' takes not more than {} argument(s)", m.text, m.params.size()));
    auto s = child(defining);
    std::vector<bool> bound(m.params.size(), false);
    for (size_t i = 0; i < a.positional.size(); ++i) {
      s->vars[m.params[i].first] = a.positional[i];
      bound[i] = true;
    }
    for (auto& [k, v] : a.keyword) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i].first != k) ++i;
      if (i == m.params.size()) fail(fmt::format("macro '{}' takes no keyword argument '{}'", m.text, k));
      if (bound[i]) fail(fmt::format("macro '{}' got multiple values for argument '{}'", m.text, k));
      s->vars[k] = v;
      bound[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      const auto& [name, dflt] = m.params[i];
      s->vars[name] = dflt ? eval(*dflt, s) : Value::undefined(fmt::format("parameter '{}' was not provided", name));
    }
    Text out;
    exec(m.body, s, out);
    line_ = saved_line;
    return Value::string(std::move(out.s));
  }

  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, scope));
    return a;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        // Shares the literal stored in the tree (the tree outlives the render).
        return Value::data_ref(std::shared_ptr<const Json>(std::shared_ptr<const Json>(), &e.literal), &e.literal);
      case Expr::Kind::Name: {
        if (const Value* v = scope->find(e.name)) return *v;
        return Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case Expr::Kind::GetAttr: {
        const Value obj = eval(*e.args[0], scope);
        line_ = e.line;
        return get_attr(obj, e.name);
      }
      case Expr::Kind::GetItem: {
        const Value obj = eval(*e.args[0], scope);
        const Value key = eval(*e.args[1], scope);
        line_ = e.line;
        return get_item(obj, key);
      }
      case Expr::Kind::Slice: {
        const Value obj = eval(*e.args[0], scope);
        Value b, st, sp;
        if (e.args[1]) b = eval(*e.args[1], scope);
        if (e.args[2]) st = eval(*e.args[2], scope);
        if (e.args[3]) sp = eval(*e.args[3], scope);
        line_ = e.line;
        return get_slice(obj, b, st, sp);
      }
      case Expr::Kind::Call: {
        const Value callee = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        line_ = e.line;
        if (callee.is_callable()) return callee.callable_obj().fn(a);
        if (callee.is_undefined())
          fail(callee.undefined_hint().empty() ? "an undefined value is not callable" : callee.undefined_hint());
        fail(fmt::format("'{}' object is not callable", type_name(callee)));
      }
      case Expr::Kind::Filter: {
        const Value v = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        line_ = e.line;
        return apply_filter(e.name, v, a);
      }
      case Expr::Kind::Test: {
        const Value v = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        line_ = e.line;
        return Value::boolean(apply_test(e.name, v, a) != e.negated);
      }
      case Expr::Kind::Not: return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        const Value v = eval(*e.args[0], scope);
        line_ = e.line;
        if (!v.is_number())
          fail(fmt::format("bad operand type for unary {}: '{}'", e.kind == Expr::Kind::Neg ? '-' : '+', type_name(v)));
        if (e.kind == Expr::Kind::Pos) return v.is_bool() ? Value::integer(v.as_int()) : v;
        if (v.is_float()) return Value::number(-v.as_double());
        const int64_t i = v.as_int();
        if (i == INT64_MIN) fail("integer overflow");
        return Value::integer(-i);
      }
      case Expr::Kind::Binary: {
        const Value a = eval(*e.args[0], scope);
        const Value b = eval(*e.args[1], scope);
        line_ = e.line;
        return binary_op(e.name, a, b);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          line_ = e.line;
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==") r = equals(left, right);
          else if (op == "!=") r = !equals(left, right);
          else if (op == "in") r = contains(right, left);
          else if (op == "notin") r = !contains(right, left);
          else {
            const int c = compare(left, right, op);
            r = c != 3 && (op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::And: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? eval(*e.args[1], scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? a : eval(*e.args[1], scope);
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.args) items.push_back(eval(*x, scope));
        line_ = e.line;
        return Value::list(std::move(items));
      }
      case Expr::Kind::Dict: {
        Json out = Json::object();
        size_t bytes = 0;  // the copies made so far, checked before each
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i], scope);
          const Value v = eval(*e.args[i + 1], scope);
          line_ = e.line;
          if (!k.is_string()) fail("dict literal keys must be strings");
          if (!v.is_data()) fail(fmt::format("a {} cannot be stored in a dict", type_name(v)));
          bytes += footprint(v.json()).bytes;
          need_bytes(bytes);
          out[k.str()] = v.json();
        }
        return Value::data(std::move(out));
      }
    }
    fail("unknown expression");
  }

  RenderLimits limits_;
  std::shared_ptr<Budget> budget_;
  int depth_ = 0;
  int line_ = 0;
};

}  // namespace

std::string render(const Template& tpl, const std::vector<std::pair<std::string, Value>>& context,
                   const RenderLimits& limits) {
  return Interpreter(limits).run(tpl, context);
}

}  // namespace fp4moe::text::jinja
