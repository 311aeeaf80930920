// Human-readable quantities for logs and reports.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace fp4moe {

// "512 B", "1.50 KiB", "2.00 GiB".
inline std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace fp4moe
