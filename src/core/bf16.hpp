// bfloat16 <-> float on the host, round to nearest even (NaN stays NaN), and `bfloat16`,
// a 2-byte value type for BF16 data (new code uses it instead of raw uint16_t bits).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fp4moe {

inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// One BF16 value: the upper 16 bits of an IEEE float32. Conversions are explicit.
struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) : bits(float_to_bf16(f)) {}
  static constexpr bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  explicit operator float() const { return bf16_to_float(bits); }
  float to_float() const { return bf16_to_float(bits); }
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

}  // namespace fp4moe
