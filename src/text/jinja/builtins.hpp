// Jinja builtins: filters, tests, attribute / item access with jinja2's sandboxed rules,
// the methods of str and dict that templates call, and the globals transformers provides
// (range, namespace, dict, raise_exception, strftime_now).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/value.hpp"

namespace fp4moe::text::jinja {

Value apply_filter(std::string_view name, const Value& v, CallArgs& args);
bool apply_test(std::string_view name, const Value& v, CallArgs& args);

// obj.name: a method of str / dict, else the dict key or namespace attribute, else Undefined.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: list / str index (negative from the end), dict key, else as get_attr.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's slice rules (null bounds are Undefined values).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop walks: list elements, dict keys, str characters; Undefined is empty.
std::vector<Value> iterate(const Value& v);
bool contains(const Value& container, const Value& item);  // Python's `in`
Value binary_op(std::string_view op, const Value& a, const Value& b);

// The global names every template sees.
std::vector<std::pair<std::string, Value>> builtin_globals();

}  // namespace fp4moe::text::jinja
