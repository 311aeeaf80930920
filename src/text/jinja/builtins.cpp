// Filters, tests and globals, with jinja2 3.1's semantics and transformers' tojson.
#include "text/jinja/builtins.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

#include "text/jinja/pystr.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text::jinja {

bool is_known_test_name(std::string_view name);

namespace {

// Binds positional and keyword arguments to named parameters (after the filtered value).
class Params {
 public:
  Params(std::string_view fname, CallArgs& a, std::initializer_list<const char*> names) : vals_(names.size()) {
    if (a.positional.size() > names.size())
      fail(fmt::format("{}() takes at most {} arguments ({} given)", fname, names.size(), a.positional.size()));
    for (size_t i = 0; i < a.positional.size(); ++i) vals_[i] = a.positional[i];
    for (auto& [k, v] : a.keyword) {
      size_t i = 0;
      for (const char* n : names) {
        if (k == n) break;
        ++i;
      }
      if (i == names.size()) fail(fmt::format("{}() got an unexpected keyword argument '{}'", fname, k));
      if (i < a.positional.size()) fail(fmt::format("{}() got multiple values for argument '{}'", fname, k));
      vals_[i] = v;
    }
  }
  const Value& operator[](size_t i) const { return vals_[i]; }
  bool given(size_t i) const { return !vals_[i].is_undefined(); }

 private:
  std::vector<Value> vals_;
};

size_t py_len(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return code_point_count(v.str());
  if (v.is_list() || v.is_dict()) return v.json().size();
  fail(fmt::format("object of type '{}' has no len()", type_name(v)));
}

// jinja2's make_attrgetter: "a.b.0" walks items / attributes.
Value attr_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  if (!attribute.is_string()) fail("attribute must be a string");
  Value cur = item;
  const std::string& path = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::optional<double> parse_py_float(std::string s) {
  s = pystr::strip(s, std::nullopt, true, true);
  std::string t;
  for (char c : s)
    if (c != '_') t += c;
  std::string low = pystr::lower(t);
  if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity") return HUGE_VAL;
  if (low == "-inf" || low == "-infinity") return -HUGE_VAL;
  if (low == "nan" || low == "+nan" || low == "-nan") return std::nan("");
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || low.find_first_of("xp") != std::string::npos) return std::nullopt;
  return d;
}

std::optional<int64_t> parse_py_int(const std::string& s0, int base) {
  std::string s = pystr::strip(s0, std::nullopt, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i >= s.size()) return std::nullopt;
  // A 0x / 0o / 0b prefix is allowed when it matches the base (base 0: taken from it).
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = char(s[i + 1] | 0x20);
    const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == pb || base == 0)) {
      base = pb;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36) return std::nullopt;
  int64_t v = 0;
  bool any = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && any && i + 1 < s.size() && s[i + 1] != '_') continue;
    int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, int64_t(base), &v) || __builtin_add_overflow(v, int64_t(d), &v)) return std::nullopt;
    any = true;
  }
  if (!any) return std::nullopt;
  return neg ? -v : v;
}

Value do_indent(const Value& v, const Params& p) {
  std::string indention;
  if (p[0].is_string()) {
    indention = p[0].str();
  } else {
    const int64_t width = p.given(0) ? p[0].as_int() : 4;
    need_bytes(size_t(std::clamp<int64_t>(width, 0, INT64_MAX >> 1)));
    indention = std::string(size_t(std::max<int64_t>(0, width)), ' ');
  }
  const bool first = truthy(p[1]), blank = truthy(p[2]);
  const std::string s = to_str(v) + "\n";
  const std::vector<std::string> lines = pystr::splitlines(s, false);
  if (!indention.empty() && lines.size() > std::numeric_limits<size_t>::max() / indention.size())
    fail("indent: the result is too large");
  need_bytes(s.size() + lines.size() * indention.size());  // at most one indention a line
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  if (first) rv = indention + rv;
  return Value::string(rv);
}

Value do_tojson(const Value& v, const Params& p) {
  DumpOptions o;
  o.ensure_ascii = truthy(p[0]);
  if (p.given(1) && !p[1].is_none()) {
    o.has_indent = true;
    if (p[1].is_string())
      o.indent = p[1].str();
    else {
      const int64_t width = p[1].as_int();
      need_bytes(size_t(std::clamp<int64_t>(width, 0, INT64_MAX >> 1)));
      o.indent = std::string(size_t(std::max<int64_t>(0, width)), ' ');
    }
    o.item_sep = ",";
  }
  if (p.given(2) && !p[2].is_none()) {
    const Value& sep = p[2];
    if (!sep.is_list() || sep.json().size() != 2 || !sep.json()[0].is_string() || !sep.json()[1].is_string())
      fail("tojson: separators must be a pair of strings");
    o.item_sep = sep.json()[0].get<std::string>();
    o.key_sep = sep.json()[1].get<std::string>();
  }
  o.sort_keys = truthy(p[3]);
  return Value::string(json_dumps(v, o));
}

// A sort / unique key: strings lowered unless case-sensitive.
Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(pystr::lower(v.str()));
  return v;
}

std::vector<Value> select_items(const Value& v, CallArgs& a, bool attr_mode, bool keep_matching) {
  std::vector<Value> items = iterate(v);
  size_t k = 0;
  Value attribute;
  if (attr_mode) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = a.positional[k++];
  }
  std::string test;
  if (k < a.positional.size()) {
    if (!a.positional[k].is_string()) fail("the test name must be a string");
    test = a.positional[k++].str();
    if (!is_known_test_name(test)) fail(fmt::format("no test named '{}'", test));
  }
  CallArgs targs;
  targs.positional.assign(a.positional.begin() + long(k), a.positional.end());
  targs.keyword = a.keyword;
  std::vector<Value> out;
  for (const Value& item : items) {
    const Value x = attr_mode ? attr_path(item, attribute) : item;
    CallArgs t = targs;
    const bool pass = test.empty() ? truthy(x) : apply_test(test, x, t);
    if (pass == keep_matching) out.push_back(item);
  }
  return out;
}

Value list_of(std::vector<Value> items) { return Value::list(std::move(items)); }

Value min_max(const Value& v, const Params& p, bool want_max) {
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("no min/max of an empty sequence");
  const bool cs = truthy(p[0]);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value a = fold_case(p.given(1) ? attr_path(items[i], p[1]) : items[i], cs);
    const Value b = fold_case(p.given(1) ? attr_path(items[best], p[1]) : items[best], cs);
    const int c = compare(a, b, want_max ? ">" : "<");
    if (c != 3 && (want_max ? c > 0 : c < 0)) best = i;
  }
  return items[best];
}

}  // namespace

bool is_known_filter(std::string_view n) {
  static const char* const kFilters[] = {
      "abs",   "capitalize", "count",  "d",       "default",    "e",      "escape", "first",   "float",
      "indent", "int",       "items",  "join",    "last",       "length", "list",   "lower",   "map",
      "max",   "min",        "reject", "rejectattr", "replace", "reverse", "safe",  "select",  "selectattr",
      "sort",  "string",     "sum",    "title",   "tojson",     "trim",   "unique", "upper",   "wordcount"};
  return std::find(std::begin(kFilters), std::end(kFilters), n) != std::end(kFilters);
}

bool is_known_test_name(std::string_view n) {
  static const char* const kTests[] = {
      "defined", "undefined", "none",  "boolean", "false",   "true",      "integer", "float",       "number",
      "string",  "mapping",   "sequence", "iterable", "callable", "sameas", "escaped", "lower",     "upper",
      "odd",     "even",      "divisibleby", "eq",   "equalto", "ne",      "lt",      "lessthan",  "le",
      "gt",      "greaterthan", "ge",   "in",      "filter",  "test"};
  return std::find(std::begin(kTests), std::end(kTests), n) != std::end(kTests);
}

bool is_known_test(std::string_view n) { return is_known_test_name(n); }

Value apply_filter(std::string_view name, const Value& v, CallArgs& a) {
  const std::string f(name);
  if (f == "length" || f == "count") {
    Params p(f, a, {});
    return Value::integer(int64_t(py_len(v)));
  }
  if (f == "default" || f == "d") {
    Params p(f, a, {"default_value", "boolean"});
    const Value dflt = p.given(0) ? p[0] : Value::string("");
    if (v.is_undefined() || (truthy(p[1]) && !truthy(v))) return dflt;
    return v;
  }
  if (f == "trim") {
    Params p(f, a, {"chars"});
    const std::optional<std::string> chars =
        p.given(0) && !p[0].is_none() ? std::optional<std::string>(to_str(p[0])) : std::nullopt;
    return Value::string(pystr::strip(to_str(v), chars, true, true));
  }
  if (f == "tojson") return do_tojson(v, Params(f, a, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  if (f == "first" || f == "last") {
    Params p(f, a, {});
    if (v.is_list()) {
      if (v.json().empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", f));
      return v.element(f == "first" ? 0 : v.json().size() - 1);
    }
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", f));
    return f == "first" ? items.front() : items.back();
  }
  if (f == "join") {
    Params p(f, a, {"d", "attribute"});
    const std::string sep = p.given(0) ? to_str(p[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      out += to_str(p.given(1) ? attr_path(item, p[1]) : item);
      need_bytes(out.size());
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (f == "items") {
    Params p(f, a, {});
    if (v.is_undefined()) return Value::data(Json::array());
    if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
    need_bytes(footprint(v.json()).bytes + v.json().size() * 40);  // copies of the entries, a pair list each
    Json out = Json::array();
    for (auto it = v.json().begin(); it != v.json().end(); ++it) out.push_back(Json::array({it.key(), it.value()}));
    return Value::data(std::move(out));
  }
  if (f == "selectattr" || f == "rejectattr") return list_of(select_items(v, a, true, f == "selectattr"));
  if (f == "select" || f == "reject") return list_of(select_items(v, a, false, f == "select"));
  if (f == "map") {
    std::vector<Value> out;
    if (a.positional.empty()) {
      Params p(f, a, {"attribute", "default"});
      if (!p.given(0)) fail("map() needs a filter name or attribute=");
      for (const Value& item : iterate(v)) {
        Value x = attr_path(item, p[0]);
        out.push_back(x.is_undefined() && p.given(1) ? p[1] : x);
      }
    } else {
      if (!a.positional[0].is_string()) fail("map(): the filter name must be a string");
      const std::string fname = a.positional[0].str();
      if (!is_known_filter(fname)) fail(fmt::format("no filter named '{}'", fname));
      CallArgs rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.keyword = a.keyword;
      for (const Value& item : iterate(v)) {
        CallArgs r = rest;
        out.push_back(apply_filter(fname, item, r));
      }
    }
    return list_of(std::move(out));
  }
  if (f == "list") {
    Params p(f, a, {});
    return list_of(iterate(v));
  }
  if (f == "string") {
    Params p(f, a, {});
    return Value::string(to_str(v));
  }
  if (f == "lower" || f == "upper" || f == "capitalize" || f == "title") {
    Params p(f, a, {});
    const std::string s = to_str(v);
    return Value::string(f == "lower"        ? pystr::lower(s)
                         : f == "upper"      ? pystr::upper(s)
                         : f == "capitalize" ? pystr::capitalize(s)
                                             : pystr::jinja_title(s));
  }
  if (f == "replace") {
    Params p(f, a, {"old", "new", "count"});
    return Value::string(pystr::replace(to_str(v), to_str(p[0]), to_str(p[1]),
                                        p.given(2) && !p[2].is_none() ? p[2].as_int() : -1));
  }
  if (f == "int") {
    Params p(f, a, {"default", "base"});
    const Value dflt = p.given(0) ? p[0] : Value::integer(0);
    if (v.is_string()) {
      if (auto i = parse_py_int(v.str(), p.given(1) ? int(p[1].as_int()) : 10)) return Value::integer(*i);
      if (auto d = parse_py_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
        return Value::integer(int64_t(*d));
      return dflt;
    }
    if (v.is_bool() || v.is_int()) return Value::integer(v.as_int());
    if (v.is_float() && std::isfinite(v.as_double()) && std::fabs(v.as_double()) < 9.2e18)
      return Value::integer(int64_t(v.as_double()));
    return dflt;
  }
  if (f == "float") {
    Params p(f, a, {"default"});
    const Value dflt = p.given(0) ? p[0] : Value::number(0.0);
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string())
      if (auto d = parse_py_float(v.str())) return Value::number(*d);
    return dflt;
  }
  if (f == "abs") {
    Params p(f, a, {});
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    if (v.is_number()) {
      const int64_t i = v.as_int();
      if (i == INT64_MIN) fail("integer overflow");
      return Value::integer(i < 0 ? -i : i);
    }
    fail(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (f == "reverse") {
    Params p(f, a, {});
    if (v.is_string()) {
      std::vector<char32_t> cps = code_points(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::string(from_code_points(cps, 0, cps.size()));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return list_of(std::move(items));
  }
  if (f == "sort") {
    Params p(f, a, {"reverse", "case_sensitive", "attribute"});
    std::vector<Value> items = iterate(v);
    const bool rev = truthy(p[0]), cs = truthy(p[1]);
    std::vector<Value> keys;
    for (const Value& it : items) keys.push_back(fold_case(p.given(2) ? attr_path(it, p[2]) : it, cs));
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    charge_steps(order.size() * (1 + size_t(std::log2(double(order.size()) + 1))) / 8);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const int c = rev ? compare(keys[y], keys[x], "<") : compare(keys[x], keys[y], "<");
      return c < 0;
    });
    std::vector<Value> out;
    for (size_t i : order) out.push_back(items[i]);
    return list_of(std::move(out));
  }
  if (f == "unique") {
    Params p(f, a, {"case_sensitive", "attribute"});
    std::vector<Value> out, seen;
    for (const Value& it : iterate(v)) {
      const Value key = fold_case(p.given(1) ? attr_path(it, p[1]) : it, truthy(p[0]));
      charge_steps(seen.size() / 8 + 1);  // compared with every key kept so far
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
        seen.push_back(key);
        out.push_back(it);
      }
    }
    return list_of(std::move(out));
  }
  if (f == "max" || f == "min") return min_max(v, Params(f, a, {"case_sensitive", "attribute"}), f == "max");
  if (f == "sum") {
    Params p(f, a, {"attribute", "start"});
    Value total = p.given(1) ? p[1] : Value::integer(0);
    for (const Value& it : iterate(v)) total = binary_op("+", total, p.given(0) ? attr_path(it, p[0]) : it);
    return total;
  }
  if (f == "safe") {
    Params p(f, a, {});
    return v;
  }
  if (f == "escape" || f == "e") {
    Params p(f, a, {});
    return Value::string(html_escape(to_str(v)));
  }
  if (f == "indent") return do_indent(v, Params(f, a, {"width", "first", "blank"}));
  if (f == "wordcount") {
    Params p(f, a, {});
    const std::string s = to_str(v);
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
      const bool w = is_rust_word_char(next_code_point(s, i));
      n += w && !in_word;
      in_word = w;
    }
    return Value::integer(n);
  }
  fail(fmt::format("no filter named '{}'", f));
}

bool apply_test(std::string_view name, const Value& v, CallArgs& a) {
  const std::string t(name);
  // The tests that take one argument ("is divisibleby 3", "is eq(x)").
  const auto other = [&]() { return Params(t, a, {"other"})[0]; };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.is_bool();
  if (t == "false") return v.is_bool() && !v.json().get<bool>();
  if (t == "true") return v.is_bool() && v.json().get<bool>();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict();
  if (t == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (t == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (t == "callable") return v.is_callable();
  if (t == "escaped") return false;
  if (t == "lower") return pystr::is_lower(to_str(v));
  if (t == "upper") return pystr::is_upper(to_str(v));
  if (t == "odd" || t == "even") {
    const int64_t i = v.as_int();
    return (i % 2 != 0) == (t == "odd");
  }
  if (t == "divisibleby") {
    const Value n = other();
    const int64_t d = n.as_int();
    if (d == 0) fail("ZeroDivisionError: integer division or modulo by zero");
    return v.as_int() % d == 0;
  }
  if (t == "eq" || t == "equalto") return equals(v, other());
  if (t == "ne") return !equals(v, other());
  if (t == "lt" || t == "lessthan" || t == "le" || t == "gt" || t == "greaterthan" || t == "ge") {
    const Value o = other();
    const int c = compare(v, o, t);
    if (c == 3) return false;
    if (t == "lt" || t == "lessthan") return c < 0;
    if (t == "le") return c <= 0;
    if (t == "gt" || t == "greaterthan") return c > 0;
    return c >= 0;
  }
  if (t == "in") return contains(other(), v);
  if (t == "sameas") {
    const Value o = other();
    if (v.is_data() && o.is_data()) {
      if (v.json().is_null() || v.json().is_boolean()) return v.json() == o.json() && o.json().type() == v.json().type();
      return &v.json() == &o.json();
    }
    return equals(v, o) && v.kind() != Value::Kind::Data;
  }
  if (t == "filter") return v.is_string() && is_known_filter(v.str());
  if (t == "test") return v.is_string() && is_known_test_name(v.str());
  fail(fmt::format("no test named '{}'", t));
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::callable("range", [](CallArgs& a) {
    if (!a.keyword.empty()) fail("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() == 3) step = a.positional[2].as_int();
    }
    if (step == 0) fail("ValueError: range() arg 3 must not be zero");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 1'000'000) fail("range() with more than 1,000,000 items is not supported");
      out.push_back(i);
    }
    return Value::data(std::move(out));
  }));
  g.emplace_back("namespace", Value::callable("namespace", [](CallArgs& a) {
    auto ns = std::make_shared<Namespace>();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("namespace() positional arguments must be dicts");
      need_bytes(p.json().size() * (kValueBytes + 64));  // an attribute (name, value) per key
      for (auto it = p.json().begin(); it != p.json().end(); ++it) {
        charge_steps(ns->attrs.size() / 16 + 1);  // set() looks the name up
        ns->set(it.key(), p.member(it.value()));
      }
    }
    for (auto& [k, v] : a.keyword) ns->set(k, v);
    return Value::ns(ns);
  }));
  g.emplace_back("dict", Value::callable("dict", [](CallArgs& a) {
    Json out = Json::object();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("dict() positional arguments must be dicts");
      need_bytes(footprint(p.json()).bytes);
      for (auto it = p.json().begin(); it != p.json().end(); ++it) {
        charge_steps(out.size() / 16 + 1);  // an insert looks the key up
        out[it.key()] = it.value();
      }
    }
    for (auto& [k, v] : a.keyword) {
      if (!v.is_data()) fail(fmt::format("a {} cannot be stored in a dict", type_name(v)));
      need_bytes(footprint(out).bytes + footprint(v.json()).bytes);
      out[k] = v.json();
    }
    return Value::data(std::move(out));
  }));
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](CallArgs& a) -> Value {
    const std::string msg = a.positional.empty() ? "" : to_str(a.positional[0]);
    throw TemplateError{one_line("raise_exception: " + msg)};
  }));
  g.emplace_back("strftime_now", Value::callable("strftime_now", [](CallArgs& a) {
    if (a.positional.size() != 1 || !a.positional[0].is_string()) fail("strftime_now(format) needs one string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].str().c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
  return g;
}

}  // namespace fp4moe::text::jinja
