// Values of the Jinja interpreter, with Python's semantics where templates can see them.
//
// Data (none, booleans, numbers, strings, lists, dicts) is an immutable
// nlohmann::ordered_json shared by pointer, so attribute access and loops never copy a
// message; dicts keep their insertion order as Python's do. Besides data a value can be
// Undefined (a missing variable or key, with jinja2's default Undefined behaviour), a
// namespace() object, or something callable (a macro, a builtin, a bound method).
#pragma once

#include <algorithm>
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

// ---- What one render may use ----------------------------------------------------------------
// The interpreter installs a Budget for the thread while it renders. Every data value made
// during the render is charged its heap footprint (footprint() below) until it is freed, so
// the live total is bounded whatever the nesting or sharing; builtins that would build a
// value larger than what is left check first (need_bytes), and every loop over data,
// comparison and copied byte counts toward the step limit, so time is bounded too. Outside a
// render (no Budget installed) nothing is charged.
class Budget {
 public:
  Budget(size_t max_bytes, uint64_t max_steps) : max_bytes_(max_bytes), max_steps_(max_steps) {}
  void charge(size_t bytes);            // throws TemplateError past max_bytes
  void release(size_t bytes) { live_ -= std::min(bytes, live_); }
  void need(size_t bytes) const;        // throws if charging `bytes` more would pass max_bytes
  void steps(uint64_t n);               // throws TemplateError past max_steps
  size_t live() const { return live_; }
  size_t peak() const { return peak_; }
  uint64_t steps_taken() const { return steps_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  size_t max_bytes_;
  uint64_t max_steps_;
  size_t live_ = 0, peak_ = 0;
  uint64_t steps_ = 0;
};

// The Budget of the render running on this thread (null outside one), set by BudgetScope.
std::shared_ptr<Budget> current_budget();
class BudgetScope {
 public:
  explicit BudgetScope(std::shared_ptr<Budget> b);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  std::shared_ptr<Budget> prev_;
};
// No-ops outside a render.
void charge_steps(uint64_t n);
void need_bytes(size_t n);
// Charged for the lifetime of the object (a loop's item list, a text buffer).
class Charge {
 public:
  Charge() = default;
  explicit Charge(size_t bytes) { add(bytes); }
  ~Charge();
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  void add(size_t bytes);

 private:
  std::shared_ptr<Budget> budget_;
  size_t bytes_ = 0;
};

// The heap a Json holds (nodes, strings, containers: an estimate of what the allocator gives)
// and its nesting depth, walked without recursion. Data made during a render may nest at
// most kMaxNesting levels (the printers and comparisons recurse).
struct Footprint {
  size_t bytes = 0;
  size_t depth = 0;
};
Footprint footprint(const Json& j);
constexpr size_t kMaxNesting = 512;
constexpr size_t kValueBytes = sizeof(Value);  // one item of a std::vector<Value>

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
