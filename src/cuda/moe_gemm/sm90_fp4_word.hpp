// The bit layout of one 32-bit code word of the sm90 weight chunks (sm90_tile_layout.hpp)
// and its decode to four BF16x2 registers, as plain integer arithmetic shared by the
// kernels (device), the re-layout (host, weight_layout.cpp) and the host tests. No CUDA
// types: compiles as C++ everywhere.
//
// A word holds the 8 E2M1 codes of one thread's wgmma / mma.sync A fragment for one 16-wide K
// step: register j (0..3) = {lo: value (j, 0), hi: value (j, 1)}. Decode target per register:
// BF16x2 with the code's magnitude bits (e1 e0 m) at bits 8..6 / 24..22 and its sign at bit
// 15 / 31, all other bits 0: that BF16 is exactly e2m1 * 2^-126 (code 1 = 0.5 is a BF16
// subnormal), and one mul.rn.bf16x2 by the block scale S = scale * 2^119 gives
// e2m1 * scale * 2^-7 exactly (the epilogue multiplies by 2^7).
//
// The target bits P = {6, 7, 8, 15} per half cannot tile a 32-bit word under shifts (no four
// translates of {0, 1, 2, 9} partition Z_16), so registers 0..2 are single shifts and
// register 3 takes the leftover bits with one extra shift + mask + multiply (three disjoint
// copies, carry-free):
//   r0 = w & P                       (stored where it lands)
//   r1 = (w << 3) & P
//   r2 = (w << 6) & P
//   r3 = (((w >> 10) & 0x001B001B) * (2^2 + 2^7 + 2^12)) & P
// Per word: 6 integer-pipe ops (5 LOP3 + 1 shift) + 3 IMAD, against 9 + 4 for the previous
// nibble-per-value layout (((w & 0x000F000F) * 0x1040) & P, ...): the integer pipe (half rate
// on sm_90) was the decode's limit.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cuda::sm90 {

inline constexpr uint32_t kFp4TargetMask = 0x81C081C0u;     // P: sign 15 / 31, magnitude 8..6 / 24..22
inline constexpr uint32_t kFp4R3PreMask = 0x001B001Bu;      // the leftover bits, after >> 10
inline constexpr uint32_t kFp4R3Mul = (1u << 2) | (1u << 7) | (1u << 12);

// Where code bit b (0: m, 1: e0, 2: e1, 3: sign) of value (register j, half h) is stored.
FP4MOE_HD constexpr int fp4_word_bit(int j, int h, int b) {
  // Target bit of code bit b in half h: 6, 7, 8, 15 (+ 16 for the high half).
  const int target = (b == 3 ? 15 : 6 + b) + 16 * h;
  if (j < 3) return target - 3 * j;
  // Register 3: stored bit s, (s - 10) lands on the target via one of the copies << 2, 7, 12.
  constexpr int lo[4] = {14, 10, 11, 13};  // m, e0, e1, sign of the low half
  return lo[b] + 16 * h;
}

// Packs 8 codes (codes[j][h], 4 bits each) into a word.
FP4MOE_HD constexpr uint32_t fp4_pack_word(const uint8_t (&codes)[4][2]) {
  uint32_t w = 0;
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 4; ++b) w |= uint32_t((codes[j][h] >> b) & 1u) << fp4_word_bit(j, h, b);
  return w;
}

// The four BF16x2 bit patterns e2m1 * 2^-126 (before the scale multiply).
FP4MOE_HD constexpr void fp4_word_to_bf16x2(uint32_t w, uint32_t (&r)[4]) {
  r[0] = w & kFp4TargetMask;
  r[1] = (w << 3) & kFp4TargetMask;
  r[2] = (w << 6) & kFp4TargetMask;
  r[3] = (((w >> 10) & kFp4R3PreMask) * kFp4R3Mul) & kFp4TargetMask;
}

// The BF16 pattern (e2m1 * 2^-126) a single code decodes to: the reference for the above.
FP4MOE_HD constexpr uint16_t fp4_code_to_bf16_bits(uint8_t code) {
  return uint16_t(((code & 7u) << 6) | ((code & 8u) << 12));
}

}  // namespace fp4moe::cuda::sm90
