#include "format/codecs.hpp"

#include <cmath>
#include <cstring>

namespace fp4moe {

namespace {

// The decision points of torch's E2M1 casts in ModelOpt: e2m1_bounds.
constexpr float kE2M1Bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

// Number of bounds strictly below a (torch.searchsorted(bounds, a), right=False).
// NaN compares false everywhere; the caller decides where it goes.
inline int count_bounds_below(float a) {
  int n = 0;
  for (float b : kE2M1Bounds) n += (a > b) ? 1 : 0;
  return n;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

uint8_t e2m1_from_float_nvfp4(float x) {
  const uint8_t sign = (x < 0.0f) ? 8 : 0;
  const float a = std::fabs(x);
  if (std::isnan(a)) return 7;  // searchsorted puts NaN after every bound; (NaN < 0) is false
  // Ties at the odd bounds (0.75, 1.75, 3.5) move up to the even level; ties at the even
  // bounds (0.25, 1.25, 2.5, 5) stay down: round half to even on the E2M1 mantissa.
  const int ord = count_bounds_below(a) + ((a == 0.75f || a == 1.75f || a == 3.5f) ? 1 : 0);
  return uint8_t(sign + ord);
}

uint8_t e2m1_from_float_mxfp4(float x) {
  // sign_bit = (2 - sign(x)) // 2: 0 for x > 0, 1 for x < 0 and for x == ±0.
  const uint8_t sign = (x > 0.0f) ? 0 : 8;
  if (std::isnan(x)) return 0;  // ModelOpt's result is undefined (a NaN cast to uint8)
  return uint8_t(sign + count_bounds_below(std::fabs(x)));
}

uint8_t e4m3_from_float(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return uint8_t(sign | kE4M3NaN);
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return uint8_t(sign | 0x7E);  // saturate (incl. inf)
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): a multiple of 2^-9, rounded half to even. a * 512 is
    // exact (a power-of-two scaling that does not overflow); q in [0, 8], and q == 8 is
    // exactly the code of 2^-6 (exponent field 1, mantissa 0).
    const float q = std::nearbyint(a * 512.0f);
    return uint8_t(sign | uint8_t(q));
  }
  // Normal: keep 3 of the 23 mantissa bits, round half to even, carry into the exponent.
  int e = int(abs_bits >> 23) - 127;  // in [-6, 8]
  uint32_t man = abs_bits & 0x7FFFFFu;
  uint32_t r = man >> 20;
  const uint32_t rem = man & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r == 8) {
    r = 0;
    ++e;
  }
  if (e > 8 || (e == 8 && r == 7)) return uint8_t(sign | 0x7E);  // 480 would be NaN: saturate
  return uint8_t(sign | uint8_t((e + 7) << 3) | uint8_t(r));
}

uint8_t e8m0_from_exponent(int e) {
  if (e < -kE8M0Bias) e = -kE8M0Bias;
  if (e > kE8M0Bias) e = kE8M0Bias;
  return uint8_t(e + kE8M0Bias);
}

uint8_t e8m0_from_float_ceil(float x) {
  if (std::isnan(x) || std::isinf(x)) return x < 0 ? 0 : kE8M0NaN;
  if (x <= 0.0f) return 0;
  int k;
  const float m = std::frexp(x, &k);  // x = m * 2^k, m in [0.5, 1)
  const int e = (m == 0.5f) ? k - 1 : k;
  return e8m0_from_exponent(e);
}

}  // namespace fp4moe
