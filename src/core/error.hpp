// One exception type and one macro family for every error in fp4moe, in .cpp and .cu alike.
//
// A bad user input (file, shape, flag) is an fp4moe::Error with a one-line message; the CLI
// prints it and exits non-zero. Internal invariants use the same macros: nothing in the
// engine calls assert() or abort() on user data.
//
// Messages are lazy: the format arguments are evaluated and formatted only when the check
// fails, so a passing FP4MOE_CHECK costs one branch (launchers on the hot path use it).
//
// Format strings are fmt's "{}" syntax. In .cpp files they are fmt format strings, checked
// at compile time. nvcc (C++20) cannot compile fmt's consteval format strings, so in .cu files
// (__CUDACC__) the same macros format at run time with format_braces(): each "{}" (or
// "{:spec}") field takes the next argument through operator<<; the spec's precision is
// honoured for floating point ("{:.2f}"), other specs are ignored.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#if !defined(__CUDACC__)
#include <fmt/format.h>
#endif

namespace fp4moe {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string msg) : std::runtime_error(std::move(msg)) {}
};

// Throws Error("<message>"); with FP4MOE_DEBUG_LOCATIONS the file:line is appended.
[[noreturn]] void throw_error(const char* file, int line, std::string msg);

namespace detail {

// Streams `v` for the field spec `spec` (the text between ':' and '}', may be empty).
template <typename T>
void put_field(std::ostringstream& os, std::string_view spec, const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    const size_t dot = spec.find('.');
    if (dot != std::string_view::npos) {
      int prec = 0;
      for (size_t i = dot + 1; i < spec.size() && spec[i] >= '0' && spec[i] <= '9'; ++i)
        prec = prec * 10 + (spec[i] - '0');
      const std::streamsize old = os.precision(prec);
      const bool fixed = spec.find('f') != std::string_view::npos;
      if (fixed) os.setf(std::ios::fixed, std::ios::floatfield);
      os << v;
      os.precision(old);
      if (fixed) os.unsetf(std::ios::floatfield);
      return;
    }
  }
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
    os << int(v);  // a number, as fmt prints int8_t / uint8_t
  } else {
    os << v;
  }
}

// Copies `f` to `os` up to its next replacement field ("{{" / "}}" unescaped) and consumes
// that field: true with the field's spec in `spec`, false when `f` has no field left.
inline bool next_field(std::ostringstream& os, std::string_view& f, std::string_view& spec) {
  while (!f.empty()) {
    const char c = f.front();
    if ((c == '{' || c == '}') && f.size() > 1 && f[1] == c) {
      os << c;
      f.remove_prefix(2);
      continue;
    }
    if (c == '{') {
      const size_t close = f.find('}');
      if (close == std::string_view::npos) break;
      std::string_view inner = f.substr(1, close - 1);
      const size_t colon = inner.find(':');
      spec = colon == std::string_view::npos ? std::string_view() : inner.substr(colon + 1);
      f.remove_prefix(close + 1);
      return true;
    }
    os << c;
    f.remove_prefix(1);
  }
  return false;
}

}  // namespace detail

// The run-time "{}" formatter the error macros use under nvcc (see above). Surplus fields
// print as "{}", surplus arguments are appended after a space.
template <typename... Args>
std::string format_braces(std::string_view f, const Args&... args) {
  std::ostringstream os;
  [[maybe_unused]] auto one = [&](const auto& v) {
    std::string_view spec;
    if (detail::next_field(os, f, spec)) {
      detail::put_field(os, spec, v);
    } else {
      os << ' ';
      detail::put_field(os, {}, v);
    }
  };
  (one(args), ...);
  std::string_view spec;
  while (detail::next_field(os, f, spec)) os << "{}";
  return os.str();
}

}  // namespace fp4moe

#if defined(__CUDACC__)
#define FP4MOE_FORMAT(...) ::fp4moe::format_braces(__VA_ARGS__)
#else
#define FP4MOE_FORMAT(...) ::fmt::format(__VA_ARGS__)
#endif

// FP4MOE_FAIL("tensor {} has {} dims", name, n) — always throws.
#define FP4MOE_FAIL(...) ::fp4moe::throw_error(__FILE__, __LINE__, FP4MOE_FORMAT(__VA_ARGS__))

// FP4MOE_CHECK(k % 32 == 0, "K = {} is not a multiple of 32", k) — the message is built only
// when the condition fails.
#define FP4MOE_CHECK(cond, ...)   \
  do {                            \
    if (!(cond)) [[unlikely]] {   \
      FP4MOE_FAIL(__VA_ARGS__);   \
    }                             \
  } while (0)
