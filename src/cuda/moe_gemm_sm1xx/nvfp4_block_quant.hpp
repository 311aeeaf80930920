// The arithmetic of one NVFP4 block (16 elements along K, one E4M3 scale) as the activation
// quantizer (nvfp4_act_quant.cu) runs it, callable on the host too (the CPU test compares it
// with format/fp4.cpp's quantize_nvfp4, bit for bit). Needs CUDA's cuda_fp8.h (host-callable;
// on sm_89+ the device uses the hardware cvt for the E4M3 rounding, the host its software twin).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_layout.hpp"

namespace fp4moe::cuda::sm1xx {

// format/codecs.cpp's e2m1_from_float_nvfp4: round half to even onto {0, .5, 1, 1.5, 2, 3, 4, 6},
// saturating; sign bit for x < 0; NaN -> 7.
FP4MOE_HOST_DEVICE inline uint32_t e2m1_code(float x) {
  const float a = x < 0.0f ? -x : x;
  if (!(a == a)) return 7u;
  uint32_t ord = (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f);
  ord += (a == 0.75f || a == 1.75f || a == 3.5f);
  return (x < 0.0f ? 8u : 0u) + ord;
}

struct Nvfp4Block {
  uint8_t sf = 0;           // E4M3 scale
  uint32_t lo = 0, hi = 0;  // codes of elements 0..7 and 8..15, element i in bits 4i (low nibble first)
};

// ModelOpt's per-block rule with a static global g (the linear's input_scale): s = amax / (6 g)
// (0 -> 1), clamped to [2^-9, 448], E4M3 (RNE, saturating); codes E2M1 of v / (e4m3(s) * g).
// g == 0: scale 1.0 (0x38), codes 0 (format/fp4.cpp's all-zero tensor).
FP4MOE_HOST_DEVICE inline Nvfp4Block quantize_block16(const float (&v)[16], float g) {
  Nvfp4Block b;
  b.sf = 0x38;
  if (g == 0.0f) return b;
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  float s = amax / (6.0f * g);
  if (s == 0.0f) s = 1.0f;
  s = fminf(fmaxf(s, 0.001953125f), 448.0f);
  b.sf = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
  const float d = __half2float(__half(__nv_cvt_fp8_to_halfraw(b.sf, __NV_E4M3))) * g;
  for (int i = 0; i < 8; ++i) b.lo |= e2m1_code(v[i] / d) << (4 * i);
  for (int i = 0; i < 8; ++i) b.hi |= e2m1_code(v[8 + i] / d) << (4 * i);
  return b;
}

}  // namespace fp4moe::cuda::sm1xx
