// Values of the Jinja interpreter, with Python's semantics where templates can see them.
//
// Data (none, booleans, numbers, strings, lists, dicts) is an immutable
// nlohmann::ordered_json shared by pointer, so attribute access and loops never copy a
// message; dicts keep their insertion order as Python's do. Besides data a value can be
// Undefined (a missing variable or key, with jinja2's default Undefined behaviour), a
// namespace() object, or something callable (a macro, a builtin, a bound method).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4moe::text::jinja {

using Json = nlohmann::ordered_json;

class Value;

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;  // for messages: "macro 'render'", "range", "str.startswith"
  std::function<Value(CallArgs&)> fn;
};

// The state behind a for loop's `loop` variable: one object advanced each iteration (as
// jinja2's LoopContext), its attributes computed when read.
struct LoopState {
  std::vector<Value> items;
  size_t index = 0;
};

// namespace() objects (and the `loop` variable): named, mutable attributes.
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  std::shared_ptr<LoopState> loop;  // set for `loop`
  Value* find(std::string_view name);
  void set(const std::string& name, Value v);
};

class Value {
 public:
  enum class Kind { Undefined, Data, Namespace, Callable };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value data(Json j);
  static Value data_ref(std::shared_ptr<const Json> root, const Json* node);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items);  // items must be data
  static Value ns(std::shared_ptr<Namespace> n);
  static Value callable(std::string name, std::function<Value(CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_data() const { return kind_ == Kind::Data; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }
  const Json& json() const { return *node_; }  // data only
  bool is_none() const { return is_data() && node_->is_null(); }
  bool is_bool() const { return is_data() && node_->is_boolean(); }
  bool is_int() const { return is_data() && node_->is_number_integer(); }
  bool is_float() const { return is_data() && node_->is_number_float(); }
  bool is_number() const { return is_data() && (node_->is_number() || node_->is_boolean()); }  // bool is an int in Python
  bool is_string() const { return is_data() && node_->is_string(); }
  bool is_list() const { return is_data() && node_->is_array(); }
  bool is_dict() const { return is_data() && node_->is_object(); }
  const std::string& str() const { return node_->get_ref<const std::string&>(); }
  int64_t as_int() const;   // bool / int (a float is an error)
  double as_double() const;  // bool / int / float
  Namespace& namespace_obj() const { return *ns_; }
  const Callable& callable_obj() const { return *fn_; }
  const std::string& undefined_hint() const { return hint_; }

  // Element i of a list / the value of a dict key, sharing this value's storage.
  Value element(size_t i) const;
  Value member(const Json& node) const;

 private:
  Kind kind_ = Kind::Undefined;
  std::shared_ptr<const Json> root_;
  const Json* node_ = nullptr;
  std::shared_ptr<Namespace> ns_;
  std::shared_ptr<Callable> fn_;
  std::string hint_;
};

// Thrown for every template error (syntax, unsupported construct, runtime); the chat
// template layer turns it into one fp4moe::Error line.
struct TemplateError {
  std::string message;
};
[[noreturn]] void fail(std::string message);

// ---- Python semantics ----------------------------------------------------------------------
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v)
std::string repr(const Value& v);    // repr(v)
std::string repr_json(const Json& j);
std::string python_float_repr(double d);
std::string type_name(const Value& v);  // Python's type name, for messages
bool equals(const Value& a, const Value& b);
bool json_equals(const Json& a, const Json& b);
int compare(const Value& a, const Value& b, std::string_view op);  // <0, 0, >0; error when unordered
// Python's json.dumps(x, ensure_ascii, indent, separators, sort_keys); indent < 0: none.
struct DumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const DumpOptions& opt);

// Python strings are sequences of code points.
std::vector<char32_t> code_points(std::string_view s);
std::string from_code_points(const std::vector<char32_t>& cps, size_t begin, size_t end);
size_t code_point_count(std::string_view s);

}  // namespace fp4moe::text::jinja
