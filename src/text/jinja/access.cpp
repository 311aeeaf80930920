// Attribute / item / slice access, iteration, `in`, arithmetic, and the str / dict methods.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "text/jinja/builtins.hpp"
#include "text/jinja/pystr.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text::jinja {

namespace {

std::optional<std::string> opt_str(const Value& v, const char* what) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  if (!v.is_string()) fail(fmt::format("{} must be a string or None, not {}", what, type_name(v)));
  return v.str();
}

const Value& arg(CallArgs& a, size_t i, const char* name, const char* method) {
  if (i < a.positional.size()) return a.positional[i];
  for (auto& [k, v] : a.keyword)
    if (k == name) return v;
  static const Value undef;
  (void)method;
  return undef;
}

void check_arity(CallArgs& a, size_t max_args, const char* method) {
  if (a.positional.size() > max_args) fail(fmt::format("{}() takes at most {} arguments", method, max_args));
}

Value str_list(const std::vector<std::string>& parts) {
  Json arr = Json::array();
  for (const std::string& p : parts) arr.push_back(p);
  return Value::data(std::move(arr));
}

bool prefix_test(const std::string& s, const Value& p, bool suffix, const char* method) {
  const auto one = [&](const std::string& x) {
    return suffix ? s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 : s.starts_with(x);
  };
  if (p.is_string()) return one(p.str());
  if (p.is_list()) {
    for (const Json& x : p.json()) {
      if (!x.is_string()) fail(fmt::format("{}: tuple items must be str", method));
      if (one(x.get<std::string>())) return true;
    }
    return false;
  }
  fail(fmt::format("{} arg must be str or a tuple of str, not {}", method, type_name(p)));
}

Value str_method(const Value& self, const std::string& name, CallArgs& a) {
  const std::string& s = self.str();
  charge_steps(s.size() / 256);  // every method walks the string
  const std::string m = "str." + name;
  if (name == "startswith" || name == "endswith") {
    check_arity(a, 1, m.c_str());
    return Value::boolean(prefix_test(s, arg(a, 0, "prefix", m.c_str()), name == "endswith", m.c_str()));
  }
  if (name == "split" || name == "rsplit") {
    check_arity(a, 2, m.c_str());
    const Value& maxv = arg(a, 1, "maxsplit", m.c_str());
    const int64_t maxsplit = maxv.is_undefined() ? -1 : maxv.as_int();
    const auto sep = opt_str(arg(a, 0, "sep", m.c_str()), "sep");
    return str_list(name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_arity(a, 1, m.c_str());
    const auto chars = opt_str(arg(a, 0, "chars", m.c_str()), "chars");
    return Value::string(pystr::strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "replace") {
    check_arity(a, 3, m.c_str());
    const Value& o = arg(a, 0, "old", m.c_str());
    const Value& n = arg(a, 1, "new", m.c_str());
    const Value& c = arg(a, 2, "count", m.c_str());
    if (!o.is_string() || !n.is_string()) fail("str.replace() arguments must be str");
    return Value::string(pystr::replace(s, o.str(), n.str(), c.is_undefined() ? -1 : c.as_int()));
  }
  if (name == "lower") return Value::string(pystr::lower(s));
  if (name == "upper") return Value::string(pystr::upper(s));
  if (name == "title") return Value::string(pystr::title(s));
  if (name == "capitalize") return Value::string(pystr::capitalize(s));
  if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex") {
    check_arity(a, 1, m.c_str());
    const Value& sub = arg(a, 0, "sub", m.c_str());
    if (!sub.is_string()) fail(fmt::format("{}() argument must be str", m));
    if (name == "count") return Value::integer(pystr::count(s, sub.str()));
    const int64_t at = pystr::find(s, sub.str(), name == "rfind" || name == "rindex");
    if (at < 0 && (name == "index" || name == "rindex")) fail("ValueError: substring not found");
    return Value::integer(at);
  }
  if (name == "join") {
    check_arity(a, 1, m.c_str());
    std::string out;
    bool first = true;
    for (const Value& item : iterate(arg(a, 0, "iterable", m.c_str()))) {
      if (!item.is_string()) fail(fmt::format("str.join: expected str instance, {} found", type_name(item)));
      if (!first) out += s;
      out += item.str();
      need_bytes(out.size());
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "splitlines") {
    const Value& keep = arg(a, 0, "keepends", m.c_str());
    return str_list(pystr::splitlines(s, truthy(keep)));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const Value& x = arg(a, 0, "prefix", m.c_str());
    if (!x.is_string()) fail(fmt::format("{}() argument must be str", m));
    if (name == "removeprefix") return Value::string(s.starts_with(x.str()) ? s.substr(x.str().size()) : s);
    return Value::string(s.ends_with(x.str()) ? s.substr(0, s.size() - x.str().size()) : s);
  }
  if (name == "isdigit") return Value::boolean(pystr::is_digit(s));
  if (name == "isalpha") return Value::boolean(pystr::is_alpha(s));
  if (name == "isalnum") return Value::boolean(pystr::is_alnum(s));
  if (name == "isspace") return Value::boolean(pystr::is_space(s));
  if (name == "isupper") return Value::boolean(pystr::is_upper(s));
  if (name == "islower") return Value::boolean(pystr::is_lower(s));
  fail(fmt::format("{}() is not supported", m));
}

bool is_str_method(const std::string& n) {
  static const char* const kNames[] = {
      "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "lower", "upper",
      "title", "capitalize", "find", "rfind", "count", "index", "rindex", "join", "splitlines", "removeprefix",
      "removesuffix", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower",
      // Python str methods that exist but are not implemented: calling them is an error.
      "format", "format_map", "center", "ljust", "rjust", "zfill", "expandtabs", "partition", "rpartition",
      "swapcase", "casefold", "encode", "isdecimal", "isnumeric", "isidentifier", "isprintable", "istitle",
      "isascii", "translate", "maketrans"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

Value dict_method(const Value& self, const std::string& name, CallArgs& a) {
  const Json& d = self.json();
  charge_steps(d.size() / 16);  // a lookup in an ordered dict walks its keys
  if (name == "items" || name == "keys" || name == "values") {
    check_arity(a, 0, ("dict." + name).c_str());
    need_bytes(footprint(d).bytes + d.size() * 40);  // copies of the entries, a pair list each
    Json out = Json::array();
    for (auto it = d.begin(); it != d.end(); ++it) {
      if (name == "items")
        out.push_back(Json::array({it.key(), it.value()}));
      else if (name == "keys")
        out.push_back(it.key());
      else
        out.push_back(it.value());
    }
    return Value::data(std::move(out));
  }
  if (name == "get") {
    check_arity(a, 2, "dict.get");
    const Value& key = arg(a, 0, "key", "dict.get");
    if (key.is_string()) {
      const auto it = d.find(key.str());
      if (it != d.end()) return self.member(*it);
    }
    const Value& dflt = arg(a, 1, "default", "dict.get");
    return dflt.is_undefined() ? Value::none() : dflt;
  }
  fail(fmt::format("dict.{}() is not supported (the sandbox forbids changing data)", name));
}

bool is_dict_method(const std::string& n) {
  static const char* const kNames[] = {"items", "keys", "values", "get", "pop", "popitem", "update",
                                       "setdefault", "clear", "copy", "fromkeys"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

bool is_list_method(const std::string& n) {
  static const char* const kNames[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort",
                                       "reverse", "copy", "index", "count"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

Value bound(const Value& self, const std::string& name, Value (*method)(const Value&, const std::string&, CallArgs&),
            const char* type) {
  return Value::callable(fmt::format("built-in method {} of {} object", name, type),
                         [self, name, method](CallArgs& a) { return method(self, name, a); });
}

// list.index / list.count read the list; the others change it, which the sandbox forbids.
Value list_method(const Value& self, const std::string& name, CallArgs& a) {
  if (name == "index" || name == "count") {
    if (!a.keyword.empty()) fail(fmt::format("list.{}() takes no keyword arguments", name));
    if (a.positional.size() != 1) fail(fmt::format("list.{}() takes exactly one argument", name));
    const Json& l = self.json();
    charge_steps(l.size() / 8);
    int64_t n = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!equals(self.element(i), a.positional[0])) continue;
      if (name == "index") return Value::integer(int64_t(i));
      ++n;
    }
    if (name == "index") fail(fmt::format("ValueError: {} is not in list", repr(a.positional[0])));
    return Value::integer(n);
  }
  fail(fmt::format("list.{}() is not supported (the sandbox forbids changing data)", name));
}

// Python slice bounds for a sequence of length n.
void slice_indices(const Value& start, const Value& stop, const Value& step, int64_t n, int64_t* b, int64_t* e,
                   int64_t* st) {
  const auto opt = [](const Value& v) { return v.is_undefined() || v.is_none(); };
  *st = opt(step) ? 1 : step.as_int();
  if (*st == 0) fail("ValueError: slice step cannot be zero");
  const int64_t lower = *st > 0 ? 0 : -1, upper = *st > 0 ? n : n - 1;
  const auto clamp = [&](const Value& v, int64_t dflt) {
    if (opt(v)) return dflt;
    int64_t x = v.as_int();
    if (x < 0) {
      x += n;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  *b = clamp(start, *st > 0 ? lower : upper);
  *e = clamp(stop, *st > 0 ? upper : lower);
}

Value loop_attr(const std::shared_ptr<LoopState>& loop, const std::string& name) {
  const size_t i = loop->index, n = loop->items.size();
  if (name == "index") return Value::integer(int64_t(i + 1));
  if (name == "index0") return Value::integer(int64_t(i));
  if (name == "revindex") return Value::integer(int64_t(n - i));
  if (name == "revindex0") return Value::integer(int64_t(n - i - 1));
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i + 1 == n);
  if (name == "length") return Value::integer(int64_t(n));
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") return i > 0 ? loop->items[i - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? loop->items[i + 1] : Value::undefined("there is no next item");
  if (name == "cycle")
    return Value::callable("loop.cycle", [i](CallArgs& a) {
      if (a.positional.empty()) fail("no items for cycling given");
      return a.positional[i % a.positional.size()];
    });
  return Value::undefined(fmt::format("'LoopContext' object has no attribute '{}'", name));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    fail(obj.undefined_hint().empty() ? fmt::format("undefined value has no attribute '{}'", name)
                                      : obj.undefined_hint());
  if (name.starts_with("_")) return Value::undefined(fmt::format("access to attribute '{}' is unsafe", name));
  if (obj.is_namespace()) {
    if (const auto& loop = obj.namespace_obj().loop) return loop_attr(loop, name);
    if (Value* v = obj.namespace_obj().find(name)) return *v;
    return Value::undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
  }
  if (!obj.is_data()) return Value::undefined(fmt::format("'{}' object has no attribute '{}'", type_name(obj), name));
  if (obj.is_dict()) {
    if (is_dict_method(name)) return bound(obj, name, dict_method, "dict");
    charge_steps(obj.json().size() / 16);  // a lookup in an ordered dict walks its keys
    const auto it = obj.json().find(name);
    if (it != obj.json().end()) return obj.member(*it);
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
  }
  if (obj.is_string() && is_str_method(name)) return bound(obj, name, str_method, "str");
  if (obj.is_list() && is_list_method(name)) return bound(obj, name, list_method, "list");
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(obj), name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined())
    fail(obj.undefined_hint().empty() ? fmt::format("undefined value has no item {}", repr(key)) : obj.undefined_hint());
  if (obj.is_namespace()) return key.is_string() ? get_attr(obj, key.str()) : Value::undefined();
  if (!obj.is_data()) return Value::undefined();
  if (obj.is_dict()) {
    if (key.is_string()) {
      charge_steps(obj.json().size() / 16);
      const auto it = obj.json().find(key.str());
      if (it != obj.json().end()) return obj.member(*it);
      return get_attr(obj, key.str());
    }
    return Value::undefined(fmt::format("'dict object' has no attribute {}", repr(key)));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = int64_t(obj.json().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("list index {} out of range", key.as_int()));
      return obj.element(size_t(i));
    }
    const std::vector<char32_t> cps = code_points(obj.str());
    const int64_t n = int64_t(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(fmt::format("string index {} out of range", key.as_int()));
    return Value::string(from_code_points(cps, size_t(i), size_t(i) + 1));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(fmt::format("'{}' object has no item {}", type_name(obj), repr(key)));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined())
    fail(obj.undefined_hint().empty() ? "cannot slice an undefined value" : obj.undefined_hint());
  int64_t b, e, st;
  if (obj.is_list()) {
    slice_indices(start, stop, step, int64_t(obj.json().size()), &b, &e, &st);
    Json out = Json::array();
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(obj.json()[size_t(i)]);
    return Value::data(std::move(out));
  }
  if (obj.is_string()) {
    const std::vector<char32_t> cps = code_points(obj.str());
    slice_indices(start, stop, step, int64_t(cps.size()), &b, &e, &st);
    std::string out;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) append_utf8(out, cps[size_t(i)]);
    return Value::string(std::move(out));
  }
  fail(fmt::format("'{}' object is not subscriptable", type_name(obj)));
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  if (v.is_data()) {  // a Value per item (and for a str or dict a new string each)
    const size_t n = v.is_string() ? v.str().size() : v.json().size();
    need_bytes(n * (kValueBytes + (v.is_list() ? 0 : 128)));
    charge_steps(n / 8);
  }
  if (v.is_list()) {
    out.reserve(v.json().size());
    for (size_t i = 0; i < v.json().size(); ++i) out.push_back(v.element(i));
    return out;
  }
  if (v.is_dict()) {
    for (auto it = v.json().begin(); it != v.json().end(); ++it) out.push_back(Value::string(it.key()));
    return out;
  }
  if (v.is_string()) {
    const std::string& s = v.str();
    for (size_t i = 0; i < s.size();) {
      const size_t b = i;
      next_code_point(s, i);
      out.push_back(Value::string(s.substr(b, i - b)));
    }
    return out;
  }
  fail(fmt::format("'{}' object is not iterable", type_name(v)));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string())
      fail(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
    charge_steps(container.str().size() / 256);
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    charge_steps(container.json().size() / 8);
    for (size_t i = 0; i < container.json().size(); ++i)
      if (equals(container.element(i), item)) return true;
    return false;
  }
  if (container.is_dict()) {
    charge_steps(container.json().size() / 16);
    return item.is_string() && container.json().contains(item.str());
  }
  fail(fmt::format("argument of type '{}' is not iterable", type_name(container)));
}

namespace {
constexpr size_t kMaxStringBytes = size_t(64) << 20;

Value concat_strings(const std::string& a, const std::string& b) {
  if (a.size() + b.size() > kMaxStringBytes) fail("string too large (over 64 MiB)");
  need_bytes(a.size() + b.size());
  return Value::string(a + b);
}
}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return concat_strings(to_str(a), to_str(b));
  const auto unsupported = [&]() -> Value {
    if (a.is_undefined() || b.is_undefined()) {
      const Value& u = a.is_undefined() ? a : b;
      fail(u.undefined_hint().empty() ? fmt::format("undefined value in '{}'", op) : u.undefined_hint());
    }
    fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r;
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? (fail("integer overflow"), Value()) : Value::integer(r);
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? (fail("integer overflow"), Value()) : Value::integer(r);
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? (fail("integer overflow"), Value()) : Value::integer(r);
      if (op == "/") {
        if (y == 0) fail("ZeroDivisionError: division by zero");
        return Value::number(double(x) / double(y));
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail("ZeroDivisionError: integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(double(x), double(y)));
        int64_t result = 1, base = x, e = y;
        while (e > 0) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) fail("integer overflow");
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
        }
        return Value::integer(result);
      }
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "/") {
      if (y == 0) fail("ZeroDivisionError: float division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail("ZeroDivisionError: float modulo");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::number(op == "//" ? std::floor(x / y) : m);
    }
    if (op == "**") return Value::number(std::pow(x, y));
  }
  if (op == "+" && a.is_string() && b.is_string()) return concat_strings(a.str(), b.str());
  if (op == "+" && a.is_list() && b.is_list()) {
    if (a.json().size() + b.json().size() > (size_t(1) << 24)) fail("list too large");
    need_bytes(footprint(a.json()).bytes + footprint(b.json()).bytes);
    Json out = a.json();
    for (const Json& x : b.json()) out.push_back(x);
    return Value::data(std::move(out));
  }
  const bool seq_a = a.is_string() || a.is_list(), seq_b = b.is_string() || b.is_list();
  const bool int_a = a.is_int() || a.is_bool(), int_b = b.is_int() || b.is_bool();
  if (op == "*" && ((seq_a && int_b) || (seq_b && int_a))) {
    const Value& seq = a.is_int() || a.is_bool() ? b : a;
    const int64_t n = (a.is_int() || a.is_bool() ? a : b).as_int();
    const size_t unit = seq.is_string() ? seq.str().size() : seq.json().size();
    if (n > 0 && unit > 0 && uint64_t(n) * unit > (uint64_t(1) << 26)) fail("sequence repetition too large");
    // What the copies take, nested data included (issue 37: [a] * 60000 with a of 1M items
    // is 60000 copies of a, not 60000 items).
    if (n > 0) {
      // A list's items are copied; its own node is not.
      const size_t each =
          seq.is_string() ? seq.str().size() : footprint(seq.json()).bytes - (sizeof(Json) + 24);
      if (each > 0 && uint64_t(n) > std::numeric_limits<size_t>::max() / each) fail("sequence repetition too large");
      need_bytes(size_t(n) * each);
    }
    // An empty sequence repeated any number of times is empty: no loop over n (issue 37's fuzz
    // finding: '' * 10**15 looped 10**15 times inside the step budget's blind spot).
    if (n <= 0 || unit == 0) return seq.is_string() ? Value::string("") : Value::data(Json::array());
    if (seq.is_string()) {
      // Doubling copies: O(bytes made), whatever the unit's length (n single bytes were n appends).
      const std::string& u = seq.str();
      std::string out;
      out.reserve(size_t(n) * u.size());
      out = u;
      while (out.size() * 2 <= size_t(n) * u.size()) out += out;
      out.append(out.data(), size_t(n) * u.size() - out.size());
      return Value::string(std::move(out));
    }
    charge_steps(uint64_t(n) * unit / 8);  // every item copied is work, as a list's walk is charged
    Json out = Json::array();
    for (int64_t i = 0; i < n; ++i)
      for (const Json& x : seq.json()) out.push_back(x);
    return Value::data(std::move(out));
  }
  if (op == "%" && a.is_string()) fail("printf-style string formatting ('...' % args) is not supported");
  return unsupported();
}

}  // namespace fp4moe::text::jinja
