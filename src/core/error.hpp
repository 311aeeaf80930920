// One exception type and one macro family for every error in fp4moe.
//
// A bad user input (file, shape, flag) is an fp4moe::Error with a one-line
// message; the CLI prints it and exits non-zero. Internal invariants use the
// same macros: nothing in the engine calls assert() or abort() on user data.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace fp4moe {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string msg) : std::runtime_error(std::move(msg)) {}
};

// Throws Error("<message>"); with FP4MOE_DEBUG_LOCATIONS the file:line is appended.
[[noreturn]] void throw_error(const char* file, int line, std::string msg);

}  // namespace fp4moe

// FP4MOE_FAIL("tensor {} has {} dims", name, n) — always throws.
#define FP4MOE_FAIL(...) ::fp4moe::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

// FP4MOE_CHECK(k % 32 == 0, "K = {} is not a multiple of 32", k)
#define FP4MOE_CHECK(cond, ...)   \
  do {                            \
    if (!(cond)) [[unlikely]] {   \
      FP4MOE_FAIL(__VA_ARGS__);   \
    }                             \
  } while (0)
