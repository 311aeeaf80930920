#include "text/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "text/unicode.hpp"

namespace fp4moe::text::jinja {

void fail(std::string message) { throw TemplateError{one_line(message)}; }

// ---- Budget --------------------------------------------------------------------------------

namespace {
thread_local std::shared_ptr<Budget> g_budget;

std::string mib(size_t bytes) {
  return bytes % (size_t(1) << 20) == 0 ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} bytes", bytes);
}
}  // namespace

void Budget::charge(size_t bytes) {
  need(bytes);
  steps(bytes / 256);  // copying is work: 1 step per 256 bytes made
  live_ += bytes;
  peak_ = std::max(peak_, live_);
}

void Budget::need(size_t bytes) const {
  if (bytes > max_bytes_ || live_ > max_bytes_ - bytes)
    fail(fmt::format("the template needs more than {} of memory (values it builds, loop items and text; the limit "
                     "against hostile templates)",
                     mib(max_bytes_)));
}

void Budget::steps(uint64_t n) {
  steps_ += n;
  if (steps_ > max_steps_)
    fail(fmt::format("the template ran more than {} steps (statements, loop iterations, calls, items walked by "
                     "filters and tests, 256-byte units copied)",
                     max_steps_));
}

std::shared_ptr<Budget> current_budget() { return g_budget; }

BudgetScope::BudgetScope(std::shared_ptr<Budget> b) : prev_(std::move(g_budget)) { g_budget = std::move(b); }
BudgetScope::~BudgetScope() { g_budget = std::move(prev_); }

void charge_steps(uint64_t n) {
  if (g_budget) g_budget->steps(n);
}

void need_bytes(size_t n) {
  if (g_budget) g_budget->need(n);
}

void Charge::add(size_t bytes) {
  if (!budget_) budget_ = g_budget;
  if (!budget_) return;
  budget_->charge(bytes);
  bytes_ += bytes;
}

Charge::~Charge() {
  if (budget_) budget_->release(bytes_);
}

Footprint footprint(const Json& root) {
  // nlohmann's node is 16 bytes; a string, array or object is a separate heap object (32 /
  // 24 / 24 bytes) plus its contents; an object entry holds its key string.
  Footprint f;
  std::vector<std::pair<const Json*, size_t>> stack{{&root, 1}};
  while (!stack.empty()) {
    const auto [j, d] = stack.back();
    stack.pop_back();
    f.depth = std::max(f.depth, d);
    f.bytes += sizeof(Json);
    switch (j->type()) {
      case Json::value_t::string: f.bytes += 32 + j->get_ref<const std::string&>().size(); break;
      case Json::value_t::array:
        f.bytes += 24;
        for (const Json& x : *j) stack.emplace_back(&x, d + 1);
        break;
      case Json::value_t::object:
        f.bytes += 24;
        for (auto it = j->begin(); it != j->end(); ++it) {
          f.bytes += 32 + it.key().size();
          stack.emplace_back(&it.value(), d + 1);
        }
        break;
      default: break;
    }
  }
  return f;
}

// ---- Namespace -----------------------------------------------------------------------------

Value* Namespace::find(std::string_view name) {
  for (auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

void Namespace::set(const std::string& name, Value v) {
  if (Value* old = find(name))
    *old = std::move(v);
  else
    attrs.emplace_back(name, std::move(v));
}

// ---- Value ---------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

namespace {
// Frees a value made during a render and gives its bytes back to the render's budget.
struct Release {
  std::shared_ptr<Budget> budget;
  size_t bytes;
  void operator()(const Json* j) const {
    budget->release(bytes);
    delete j;
  }
};
constexpr size_t kControlBlock = 48;  // the shared_ptr's control block with its deleter
}  // namespace

Value Value::data(Json j) {
  Value v;
  v.kind_ = Kind::Data;
  if (g_budget && (j.is_structured() || j.is_string())) {
    const Footprint f = footprint(j);
    if (f.depth > kMaxNesting) fail(fmt::format("a value nested deeper than {} levels", kMaxNesting));
    g_budget->charge(f.bytes + kControlBlock);
    v.root_ = std::shared_ptr<const Json>(new Json(std::move(j)), Release{g_budget, f.bytes + kControlBlock});
  } else if (g_budget) {
    g_budget->charge(sizeof(Json) + kControlBlock);
    v.root_ = std::shared_ptr<const Json>(new Json(std::move(j)), Release{g_budget, sizeof(Json) + kControlBlock});
  } else {
    v.root_ = std::make_shared<const Json>(std::move(j));
  }
  v.node_ = v.root_.get();
  return v;
}

Value Value::data_ref(std::shared_ptr<const Json> root, const Json* node) {
  Value v;
  v.kind_ = Kind::Data;
  v.root_ = std::move(root);
  v.node_ = node;
  return v;
}

Value Value::none() { return data(Json()); }
Value Value::boolean(bool b) { return data(Json(b)); }
Value Value::integer(int64_t i) { return data(Json(i)); }
Value Value::number(double d) { return data(Json(d)); }
Value Value::string(std::string s) { return data(Json(std::move(s))); }

Value Value::list(std::vector<Value> items) {
  Json arr = Json::array();
  if (g_budget) {  // the items are copied: check the total before making it
    size_t total = 0;
    for (const Value& it : items)
      if (it.is_data()) total += footprint(it.json()).bytes;
    g_budget->need(total);
  }
  for (const Value& it : items) {
    if (!it.is_data()) fail(fmt::format("a {} cannot be stored in a list", type_name(it)));
    arr.push_back(it.json());
  }
  return data(std::move(arr));
}

Value Value::ns(std::shared_ptr<Namespace> n) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.ns_ = std::move(n);
  return v;
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

int64_t Value::as_int() const {
  if (is_bool()) return node_->get<bool>() ? 1 : 0;
  if (is_int()) {
    if (node_->is_number_unsigned() && node_->get<uint64_t>() > uint64_t(INT64_MAX)) fail("integer too large");
    return node_->get<int64_t>();
  }
  fail(fmt::format("expected an integer, got {}", type_name(*this)));
}

double Value::as_double() const {
  if (is_bool()) return node_->get<bool>() ? 1.0 : 0.0;
  if (is_data() && node_->is_number()) return node_->get<double>();
  fail(fmt::format("expected a number, got {}", type_name(*this)));
}

Value Value::element(size_t i) const { return data_ref(root_, &(*node_)[i]); }
Value Value::member(const Json& node) const { return data_ref(root_, &node); }

// ---- Python semantics ----------------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::Namespace:
    case Value::Kind::Callable: return true;
    case Value::Kind::Data: break;
  }
  const Json& j = v.json();
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer: return j.get<int64_t>() != 0;
    case Json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case Json::value_t::number_float: return j.get<double>() != 0.0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object: return !j.empty();
    default: return true;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);  // shortest round trip
  std::string_view s(buf, size_t(res.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  const int exp10 = std::stoi(std::string(s.substr(e + 1)));
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const size_t int_len = size_t(exp10) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out += "0." + std::string(size_t(-exp10 - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

namespace {

void hex_escape(std::string& out, char32_t cp) {
  if (cp < 0x100)
    out += fmt::format("\\x{:02x}", uint32_t(cp));
  else if (cp < 0x10000)
    out += fmt::format("\\u{:04x}", uint32_t(cp));
  else
    out += fmt::format("\\U{:08x}", uint32_t(cp));
}

std::string str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  need_bytes(4 * s.size() + 2);  // escapes take up to 4 bytes a byte
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    if (cp == char32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      hex_escape(out, cp);
    } else if (cp < 0x80 || is_python_printable(cp)) {
      append_utf8(out, cp);
    } else {
      hex_escape(out, cp);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string repr_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float: return python_float_repr(j.get<double>());
    case Json::value_t::string: return str_repr(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) {
        out += (i ? ", " : "") + repr_json(j[i]);
        need_bytes(out.size());
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        out += (first ? "" : ", ") + str_repr(it.key()) + ": " + repr_json(it.value());
        need_bytes(out.size());
        first = false;
      }
      return out + "}";
    }
    default: return "<binary>";
  }
}

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, x] : v.namespace_obj().attrs) {
        out += (first ? "" : ", ") + str_repr(k) + ": " + repr(x);
        first = false;
      }
      return out + "}>";
    }
    case Value::Kind::Callable: return "<" + v.callable_obj().name + ">";
    case Value::Kind::Data: return repr_json(v.json());
  }
  return {};
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.str();
  return repr(v);
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
    case Value::Kind::Data: break;
  }
  switch (v.json().type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "int";
    case Json::value_t::number_float: return "float";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    default: return "object";
  }
}

namespace {

bool is_num(const Json& j) { return j.is_number() || j.is_boolean(); }

// Exact comparison of two Python numbers (ints compare exactly, a float by value).
int num_cmp(const Json& a, const Json& b) {
  const auto as_i = [](const Json& j, bool* ok) -> int64_t {
    *ok = true;
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) *ok = false;
    if (j.is_number_float()) *ok = false;
    return *ok ? j.get<int64_t>() : 0;
  };
  bool ia, ib;
  const int64_t x = as_i(a, &ia), y = as_i(b, &ib);
  if (ia && ib) return x < y ? -1 : x > y ? 1 : 0;
  const double dx = a.is_boolean() ? double(a.get<bool>()) : a.get<double>();
  const double dy = b.is_boolean() ? double(b.get<bool>()) : b.get<double>();
  if (std::isnan(dx) || std::isnan(dy)) return 2;  // unordered
  return dx < dy ? -1 : dx > dy ? 1 : 0;
}

}  // namespace

bool json_equals(const Json& a, const Json& b) {
  if (is_num(a) && is_num(b)) return num_cmp(a, b) == 0;
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Json::value_t::null: return true;
    case Json::value_t::string:
      charge_steps(a.get_ref<const std::string&>().size() / 256);
      return a.get_ref<const std::string&>() == b.get_ref<const std::string&>();
    case Json::value_t::array:
      if (a.size() != b.size()) return false;
      charge_steps(a.size() / 16);
      for (size_t i = 0; i < a.size(); ++i)
        if (!json_equals(a[i], b[i])) return false;
      return true;
    case Json::value_t::object:
      if (a.size() != b.size()) return false;
      charge_steps(a.size() / 16);
      for (auto it = a.begin(); it != a.end(); ++it) {
        charge_steps(b.size() / 16);  // find() walks an ordered dict's keys
        const auto jt = b.find(it.key());
        if (jt == b.end() || !json_equals(it.value(), *jt)) return false;
      }
      return true;
    default: return a == b;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_data() && b.is_data()) return json_equals(a.json(), b.json());
  if (a.is_namespace() && b.is_namespace()) return &a.namespace_obj() == &b.namespace_obj();
  if (a.is_callable() && b.is_callable()) return &a.callable_obj() == &b.callable_obj();
  return false;
}

namespace {

int json_compare(const Json& a, const Json& b, std::string_view op, const Value& va, const Value& vb) {
  if (is_num(a) && is_num(b)) {
    const int c = num_cmp(a, b);
    return c == 2 ? 3 : c;  // NaN: every ordering is false
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    const size_t n = std::min(a.size(), b.size());
    for (size_t i = 0; i < n; ++i)
      if (!json_equals(a[i], b[i])) return json_compare(a[i], b[i], op, va, vb);
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(Value::data(a)),
                   type_name(Value::data(b))));
}

}  // namespace

int compare(const Value& a, const Value& b, std::string_view op) {
  if (!a.is_data() || !b.is_data())
    fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
  return json_compare(a.json(), b.json(), op, a, b);
}

// ---- json.dumps ----------------------------------------------------------------------------

namespace {

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  need_bytes(out.size() + 6 * s.size() + 2);  // \u escapes take up to 6 bytes a byte
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        const char32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", uint32_t(0xD800 + (v >> 10)), uint32_t(0xDC00 + (v & 0x3FF)));
      } else {
        out += fmt::format("\\u{:04x}", uint32_t(cp));
      }
    } else {
      append_utf8(out, cp);
    }
  }
  out += '"';
}

void dump(std::string& out, const Json& j, const DumpOptions& o, int level) {
  const auto newline = [&](int lvl) {
    need_bytes(out.size() + 1 + size_t(lvl) * o.indent.size());
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_integer: out += std::to_string(j.get<int64_t>()); return;
    case Json::value_t::number_unsigned: out += std::to_string(j.get<uint64_t>()); return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float_repr(d);
      return;
    }
    case Json::value_t::string: dump_string(out, j.get_ref<const std::string&>(), o.ensure_ascii); return;
    case Json::value_t::array: {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.has_indent) newline(level + 1);
        dump(out, j[i], o, level + 1);
        need_bytes(out.size());
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        out += "{}";
        return;
      }
      std::vector<Json::const_iterator> items;
      for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.key() < b.key(); });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.has_indent) newline(level + 1);
        dump_string(out, items[i].key(), o.ensure_ascii);
        out += o.key_sep;
        dump(out, items[i].value(), o, level + 1);
        need_bytes(out.size());
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default: fail("Object of this type is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const DumpOptions& opt) {
  if (!v.is_data()) fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  std::string out;
  dump(out, v.json(), opt, 0);
  return out;
}

// ---- code points ---------------------------------------------------------------------------

std::vector<char32_t> code_points(std::string_view s) {
  need_bytes(4 * s.size());
  charge_steps(s.size() / 256);
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_code_point(s, i));
  return out;
}

std::string from_code_points(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace fp4moe::text::jinja
