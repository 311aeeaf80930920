// Argument checks usable from .cu files: nvcc cannot compile fmt's consteval format
// strings (core/error.hpp), so .cu launchers report through this plain function,
// which throws fp4moe::Error(msg) (defined in host_check.cpp).
#pragma once

#include <string>

namespace fp4moe::cuda {

[[noreturn]] void fail_invalid(const std::string& msg);

inline void require(bool ok, const std::string& msg) {
  if (!ok) [[unlikely]] fail_invalid(msg);
}

}  // namespace fp4moe::cuda
