#include "cpu/scale_tables.hpp"

#include <cmath>
#include <limits>

namespace fp4moe::cpu {

float e4m3_to_float(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xF, man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(float(man), -9)                  // subnormal: m * 2^-9
                             : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

float e8m0_to_float(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(code) - 127);
}

ScaleTable make_scale_table(Fp4Format format, float global_scale) {
  static const ScaleTable kE4m3 = [] {
    ScaleTable t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_float(uint8_t(c));
    return t;
  }();
  static const ScaleTable kE8m0 = [] {
    ScaleTable t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e8m0_to_float(uint8_t(c));
    return t;
  }();
  if (format == Fp4Format::MXFP4) return kE8m0;
  ScaleTable t;
  for (size_t c = 0; c < 256; ++c) t[c] = kE4m3[c] * global_scale;
  return t;
}

}  // namespace fp4moe::cpu
