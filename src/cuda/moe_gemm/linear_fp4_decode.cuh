// Device decode of the linear FP4 layout used by the Generic and DequantCublas paths:
// E2M1 nibbles, E4M3 (NVFP4) and E8M0 (MXFP4) block scales, to FP32 / BF16.
// Every E2M1 x scale product is exact in BF16 (NVFP4: <= 5 significant bits; MXFP4: a
// power of two times E2M1, exact unless it leaves the BF16 range).
#pragma once

#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#if !defined(FP4MOE_CUDA_EMU)
#include <cuda_bf16.h>
#endif

namespace fp4moe::cuda::linear_fp4 {

// E2M1 code (bit 3 sign, bits 2..0 magnitude index) -> float, branch-free bit assembly:
// magnitude c: 0 -> 0, 1 -> 0.5, c >= 2 -> (1 + (c & 1) / 2) * 2^((c >> 1) - 1).
__device__ __forceinline__ float e2m1_to_float(uint32_t code) {
  const uint32_t c = code & 7u;
  uint32_t bits = c >= 2u ? ((((c >> 1) + 126u) << 23) | ((c & 1u) << 22)) : (c ? 0x3F000000u : 0u);
  bits |= (code & 8u) << 28;
  return __uint_as_float(bits);
}

// FP8 E4M3 (fn: no infinities, S.1111.111 is NaN), bias 7, subnormals m * 2^-9.
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : float(m) * 0.001953125f;
  if (e == 15u && m == 7u) v = __uint_as_float(0x7FC00000u);
  return (b & 0x80u) ? -v : v;
}

// E8M0: 2^(s - 127); 255 is NaN.
__device__ __forceinline__ float e8m0_to_float(uint32_t s) {
  if (s == 255u) return __uint_as_float(0x7FC00000u);
  return s ? __uint_as_float(s << 23) : __uint_as_float(0x00400000u);
}

template <bool kMx>
__device__ __forceinline__ float scale_to_float(uint32_t b) {
  if constexpr (kMx) {
    return e8m0_to_float(b);
  } else {
    return e4m3_to_float(b);
  }
}

// 16 E2M1 values (8 bytes, element 2j in the low nibble of byte j) times one scale ->
// 16 BF16 values packed as 8 x bf16x2 (element 2j in the low half of word j).
__device__ __forceinline__ void decode16_bf16(uint2 packed, float scale, uint32_t (&out)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t word = j < 4 ? packed.x : packed.y;
    const uint32_t byte = (word >> (8 * (j & 3))) & 0xFFu;
    out[j] = prims::pack_bf16x2(e2m1_to_float(byte & 15u) * scale, e2m1_to_float(byte >> 4) * scale);
  }
}

}  // namespace fp4moe::cuda::linear_fp4
