// Bit-exact codecs of the small floating-point formats of NVFP4 / MXFP4.
//
//   E2M1  (FP4):  s.ee.m, bias 1; magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}; no inf/NaN.
//                 Code 8 is −0. Two per byte, element 0 in the low nibble.
//   E4M3  (FP8 "fn"): s.eeee.mmm, bias 7, max ±448, subnormals down to 2^-9, no inf;
//                 0x7F / 0xFF are NaN.
//   E8M0  (MX scale): unsigned exponent, value 2^(s-127); 0xFF is NaN; no zero, no sign.
//
// Decoders are table driven and inline so they can sit in hot loops; encoders are
// out of line (codecs.cpp) and follow NVIDIA ModelOpt's rounding where the formats
// are produced by it (see the comment on each).
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace fp4moe {

// ---- E2M1 --------------------------------------------------------------------
inline constexpr float kE2M1Max = 6.0f;

// Value of each 4-bit code; code 8 decodes to −0.0f.
inline constexpr std::array<float, 16> kE2M1Table = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float e2m1_to_float(uint8_t code) { return kE2M1Table[code & 0xF]; }

// One packed byte -> its two values: [0] from the low nibble (element 2j), [1] from the
// high nibble (element 2j+1).
struct E2M1Pair {
  float lo, hi;
};
inline constexpr std::array<E2M1Pair, 256> kE2M1PairTable = [] {
  std::array<E2M1Pair, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = {kE2M1Table[b & 0xF], kE2M1Table[b >> 4]};
  return t;
}();

// ModelOpt NVFP4QTensor._cast_fp4: round |x| to the nearest E2M1 magnitude, ties to the
// even mantissa (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), saturate at 6;
// the sign bit is set for every x < 0 (so small negatives give −0, code 8; −0.0f and +0.0f
// give code 0). NaN gives code 7, as torch.searchsorted sorts NaN last.
uint8_t e2m1_from_float_nvfp4(float x);

// ModelOpt MXFP4QTensor.quantize's cast_fp4: |x| rounds to the largest level whose lower
// bound it strictly exceeds, i.e. ties round toward zero (0.75->0.5, 1.25->1, 5->4);
// saturate at 6. The sign bit is (2 - sign(x)) // 2: set for x < 0 AND for x == ±0 (so
// every zero becomes code 8).
uint8_t e2m1_from_float_mxfp4(float x);

// Packs two codes: element 0 (`lo`) in bits 3..0, element 1 (`hi`) in bits 7..4.
inline uint8_t e2m1_pack(uint8_t lo, uint8_t hi) { return uint8_t((lo & 0xF) | ((hi & 0xF) << 4)); }

// ---- E4M3 (fn) ---------------------------------------------------------------
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE4M3MinSubnormal = 0.001953125f;  // 2^-9
inline constexpr uint8_t kE4M3NaN = 0x7F;

// Exact decode of one code, computed from the bits (used to build the table).
constexpr float e4m3_decode_bits(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xF, man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);  // NaN
  float mag;
  if (exp == 0) {
    mag = float(man) * 0.001953125f;  // subnormal: man * 2^-9
  } else {
    // (1 + man/8) * 2^(exp-7): build the float32 bits directly (exact).
    return std::bit_cast<float>(sign | ((exp - 7 + 127) << 23) | (man << 20));
  }
  return sign ? -mag : mag;
}

inline constexpr std::array<float, 256> kE4M3Table = [] {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = e4m3_decode_bits(uint8_t(c));
  return t;
}();

inline float e4m3_to_float(uint8_t code) { return kE4M3Table[code]; }

// float -> E4M3, round to nearest even (subnormals included), saturating: finite values
// and ±inf beyond ±448 give ±448 (0x7E / 0xFE); NaN gives 0x7F (sign kept). On inputs in
// [-448, 448] this equals torch's float -> float8_e4m3fn cast, which ModelOpt uses after
// clamping block scales to [2^-9, 448].
uint8_t e4m3_from_float(float x);

// ---- E8M0 --------------------------------------------------------------------
inline constexpr uint8_t kE8M0NaN = 0xFF;
inline constexpr int kE8M0Bias = 127;

inline constexpr std::array<float, 256> kE8M0Table = [] {
  std::array<float, 256> t{};
  // 2^(s-127): s >= 1 is a normal float with biased exponent s; s == 0 is 2^-127, the
  // float32 subnormal with only bit 22 set.
  t[0] = std::bit_cast<float>(0x00400000u);
  for (int s = 1; s < 255; ++s) t[s] = std::bit_cast<float>(uint32_t(s) << 23);
  t[255] = std::bit_cast<float>(0x7FC00000u);
  return t;
}();

inline float e8m0_to_float(uint8_t code) { return kE8M0Table[code]; }

// Code of 2^e, e clamped to [-127, 127]. (There is no code for 0 or for non-powers of 2.)
uint8_t e8m0_from_exponent(int e);

// Code of the smallest power of two >= x (x > 0), clamped to [2^-127, 2^127]; x <= 0
// gives 2^-127 (code 0); NaN and +inf give 0xFF. This is the MX scale rule for
// x = block_amax / 6 with an exact log2; see mxfp4 quantize for ModelOpt's float32 log2.
uint8_t e8m0_from_float_ceil(float x);

}  // namespace fp4moe
