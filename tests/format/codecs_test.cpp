// Exhaustive tests of the E2M1 / E4M3 / E8M0 codecs against independent references.
#include "format/codecs.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace fp4moe {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Reference E4M3 (fn) decode straight from the definition.
double e4m3_ref(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Reference E4M3 encode: nearest of all finite codes, ties to the even code, saturating.
uint8_t e4m3_encode_ref(float x) {
  if (std::isnan(x)) return uint8_t((std::signbit(x) ? 0x80 : 0) | 0x7F);
  const double a = std::fabs(double(x));
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7F; ++c) {  // positive finite codes 0..0x7E
    const double d = std::fabs(e4m3_ref(uint8_t(c)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = c;
    }
  }
  return uint8_t((std::signbit(x) ? 0x80 : 0) | best);
}

constexpr double kLevels[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Nearest E2M1 magnitude index; ties go to the even index (nvfp4) or down (mxfp4).
int e2m1_index_ref(double a, bool ties_down) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 8; ++i) {
    const double d = std::fabs(kLevels[i] - a);
    if (d < best_d || (d == best_d && !ties_down && (i & 1) == 0)) {
      best_d = d;
      best = i;
    }
  }
  return best;
}

TEST(E4M3, DecodesAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const double ref = e4m3_ref(uint8_t(c));
    const float got = e4m3_to_float(uint8_t(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      EXPECT_TRUE(c == 0x7F || c == 0xFF) << c;
    } else {
      EXPECT_EQ(double(got), ref) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_float(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
}

TEST(E4M3, EncodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(uint8_t(c))), c) << c;
  }
}

TEST(E4M3, EncodeMidpointsTiesToEven) {
  // Every midpoint between adjacent positive codes, and one float either side of it.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    const float mid = float((double(lo) + double(hi)) / 2);  // exact: few mantissa bits
    ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
    const int even = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(e4m3_from_float(mid), even) << "midpoint of " << c;
    EXPECT_EQ(e4m3_from_float(-mid), 0x80 | even) << "midpoint of -" << c;
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid, 1e9f)), c + 1) << c;
  }
}

TEST(E4M3, EncodeSaturatesAndKeepsNaN) {
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(463.99f), 0x7E);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(500.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(e4m3_from_float(-1e30f), 0xFE);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(1e-30f), 0x00);              // underflow to zero
  EXPECT_EQ(e4m3_from_float(0.0009765625f), 0x00);       // 2^-10: tie between 0 and 2^-9 -> 0
  EXPECT_EQ(e4m3_from_float(0.0009765626f), 0x01);
  EXPECT_EQ(e4m3_from_float(0.0029296875f), 0x02);       // 1.5 * 2^-9 -> 2 * 2^-9
}

TEST(E4M3, EncodeMatchesBruteForceOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-14.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(expo(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    if (i % 3 == 0) x = from_bits(bits(x) & 0xFFF00000u) + 0.0f;  // few mantissa bits: many ties
    ASSERT_EQ(e4m3_from_float(x), e4m3_encode_ref(x)) << x;
  }
}

TEST(E8M0, DecodesAll256Codes) {
  for (int s = 0; s < 255; ++s) {
    EXPECT_EQ(double(e8m0_to_float(uint8_t(s))), std::ldexp(1.0, s - 127)) << s;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
}

TEST(E8M0, Encode) {
  for (int e = -127; e <= 127; ++e) {
    EXPECT_EQ(e8m0_from_exponent(e), e + 127);
    const float p = std::ldexp(1.0f, e);
    EXPECT_EQ(e8m0_from_float_ceil(p), e + 127) << e;
    if (e < 127 && e > -126) {
      EXPECT_EQ(e8m0_from_float_ceil(std::nextafter(p, 1e38f)), e + 128) << e;
      EXPECT_EQ(e8m0_from_float_ceil(std::nextafter(p, 0.0f)), e + 127) << e;
    }
  }
  EXPECT_EQ(e8m0_from_exponent(-500), 0);
  EXPECT_EQ(e8m0_from_exponent(500), 254);
  EXPECT_EQ(e8m0_from_float_ceil(0.0f), 0);
  EXPECT_EQ(e8m0_from_float_ceil(1e-45f), 0);
  EXPECT_EQ(e8m0_from_float_ceil(3e38f), 254);
  EXPECT_EQ(e8m0_from_float_ceil(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(e8m0_from_float_ceil(std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_EQ(e8m0_from_float_ceil(0.75f), 127);
  EXPECT_EQ(e8m0_from_float_ceil(1.5f), 128);
}

TEST(E2M1, DecodesAll16CodesAndPairs) {
  for (int c = 0; c < 16; ++c) {
    const double ref = (c & 8 ? -1.0 : 1.0) * kLevels[c & 7];
    EXPECT_EQ(double(e2m1_to_float(uint8_t(c))), ref) << c;
    EXPECT_EQ(std::signbit(e2m1_to_float(uint8_t(c))), (c & 8) != 0) << c;
  }
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(kE2M1PairTable[b].lo, e2m1_to_float(uint8_t(b & 0xF))) << b;
    EXPECT_EQ(kE2M1PairTable[b].hi, e2m1_to_float(uint8_t(b >> 4))) << b;
    EXPECT_EQ(e2m1_pack(uint8_t(b & 0xF), uint8_t(b >> 4)), b);
  }
}

TEST(E2M1, Nvfp4EncodeTiesToEvenAndSaturates) {
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int want[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(e2m1_from_float_nvfp4(ties[i]), want[i]) << ties[i];
    EXPECT_EQ(e2m1_from_float_nvfp4(-ties[i]), 8 + want[i]) << -ties[i];
  }
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_from_float_nvfp4(e2m1_to_float(uint8_t(c))), c == 8 ? 0 : c);
  EXPECT_EQ(e2m1_from_float_nvfp4(6.5f), 7);
  EXPECT_EQ(e2m1_from_float_nvfp4(1e30f), 7);
  EXPECT_EQ(e2m1_from_float_nvfp4(-7.0f), 15);
  EXPECT_EQ(e2m1_from_float_nvfp4(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(e2m1_from_float_nvfp4(std::numeric_limits<float>::quiet_NaN()), 7);
  EXPECT_EQ(e2m1_from_float_nvfp4(0.0f), 0);
  EXPECT_EQ(e2m1_from_float_nvfp4(-0.0f), 0);   // (-0 < 0) is false
  EXPECT_EQ(e2m1_from_float_nvfp4(-0.1f), 8);   // small negative -> -0
  EXPECT_EQ(e2m1_from_float_nvfp4(-1e-40f), 8);
}

TEST(E2M1, Mxfp4EncodeTiesDownAndSignsZeros) {
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(e2m1_from_float_mxfp4(ties[i]), i) << ties[i];
    EXPECT_EQ(e2m1_from_float_mxfp4(-ties[i]), 8 + i) << -ties[i];
  }
  EXPECT_EQ(e2m1_from_float_mxfp4(0.0f), 8);
  EXPECT_EQ(e2m1_from_float_mxfp4(-0.0f), 8);
  EXPECT_EQ(e2m1_from_float_mxfp4(1e-40f), 0);
  EXPECT_EQ(e2m1_from_float_mxfp4(-1e-40f), 8);
  EXPECT_EQ(e2m1_from_float_mxfp4(6.0f), 7);
  EXPECT_EQ(e2m1_from_float_mxfp4(100.0f), 7);
  EXPECT_EQ(e2m1_from_float_mxfp4(-100.0f), 15);
}

TEST(E2M1, EncodersMatchBruteForceOnRandomFloats) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 50000; ++i) {
    float x = u(rng);
    if (i % 4 == 0) x = std::round(x * 4.0f) / 4.0f;  // lands on levels and bounds often
    const double a = std::fabs(double(x));
    const int nv = e2m1_index_ref(a, false), mx = e2m1_index_ref(a, true);
    ASSERT_EQ(e2m1_from_float_nvfp4(x), (x < 0 ? 8 : 0) + nv) << x;
    ASSERT_EQ(e2m1_from_float_mxfp4(x), (x > 0 ? 0 : 8) + mx) << x;
  }
}

}  // namespace
}  // namespace fp4moe
