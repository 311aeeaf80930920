// Typed, checked reads of config.json fields: a missing or null field gives the default (or
// an error when there is none), a field of the wrong type or range is one error line naming
// the file and the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace fp4moe {

struct Reader {
  const nlohmann::json& j;
  const std::string& path;

  const nlohmann::json* field(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return field(key) != nullptr; }

  // Integers are bounded by [min, max] (max at most 2^40): one line names the key and the range.
  int64_t integer(const char* key, std::optional<int64_t> def = std::nullopt, int64_t min = 0,
                  int64_t max = int64_t(1) << 40) const {
    const nlohmann::json* v = field(key);
    if (!v) {
      FP4MOE_CHECK(def.has_value(), "{}: missing '{}'", path, key);
      return *def;
    }
    FP4MOE_CHECK(v->is_number_integer(), "{}: '{}' must be an integer (got {})", path, key, v->dump());
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX
                                                                                           : v->get<int64_t>();
    FP4MOE_CHECK(x >= min && x <= max, "{}: '{}' = {} is out of range (allowed {}..{})", path, key, x, min, max);
    return x;
  }
  double number(const char* key, double def) const {
    const nlohmann::json* v = field(key);
    if (!v) return def;
    FP4MOE_CHECK(v->is_number(), "{}: '{}' must be a number (got {})", path, key, v->dump());
    const double x = v->get<double>();
    FP4MOE_CHECK(std::isfinite(x), "{}: '{}' is not finite", path, key);
    return x;
  }
  // A finite number in [lo, hi] (the default is not checked).
  double number(const char* key, double def, double lo, double hi) const {
    const double x = number(key, def);
    FP4MOE_CHECK(!has(key) || (x >= lo && x <= hi), "{}: '{}' = {} is out of range (allowed {}..{})", path, key, x,
                 lo, hi);
    return x;
  }
  bool boolean(const char* key, bool def) const {
    const nlohmann::json* v = field(key);
    if (!v) return def;
    FP4MOE_CHECK(v->is_boolean(), "{}: '{}' must be true or false (got {})", path, key, v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key, std::string def = "") const {
    const nlohmann::json* v = field(key);
    if (!v) return def;
    FP4MOE_CHECK(v->is_string(), "{}: '{}' must be a string (got {})", path, key, v->dump());
    return v->get<std::string>();
  }
};

}  // namespace fp4moe
