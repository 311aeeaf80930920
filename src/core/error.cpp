#include "core/error.hpp"

#include <cstdlib>

namespace fp4moe {

void throw_error(const char* file, int line, std::string msg) {
  static const bool with_location = std::getenv("FP4MOE_DEBUG_LOCATIONS") != nullptr;
  if (with_location) msg += fmt::format(" [{}:{}]", file, line);
  throw Error(std::move(msg));
}

}  // namespace fp4moe
