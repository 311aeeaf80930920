// The kernel behind rope.hpp (BF16 in place, FP32 angles). Kernels only: rope_bf16.cu launches
// it, tests/ops/backend_ops_emu_test runs it through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::rope {

inline constexpr int kRopeThreads = 256;
inline constexpr int kRopePairs = 8;  // pairs per thread whose loads are in flight at once

namespace {

using rowprims::bf16;

// One CTA per token. The token's heads · half pairs go in rounds of kRopeThreads · kRopePairs: a
// thread loads its kRopePairs pairs (and their inverse frequencies) first, then rotates and
// stores them, so a round costs one memory round trip (GLM-5's MLA query: 64 heads × 32 pairs,
// one round).
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(uint16_t* x, int heads, int64_t ts, int64_t hs, int offset,
                                                            int half, const int32_t* positions, const float* inv_freq,
                                                            float af, bool interleaved) {
  const int t = blockIdx.x, n = heads * half;
  const float p = float(positions[t]);
  bf16* xt = reinterpret_cast<bf16*>(x + t * ts + offset);
  for (int g = 0; g < n; g += kRopeThreads * kRopePairs) {
    float x0[kRopePairs], x1[kRopePairs], f[kRopePairs];
#pragma unroll
    for (int k = 0; k < kRopePairs; ++k) {
      const int idx = g + k * kRopeThreads + int(threadIdx.x);
      x0[k] = x1[k] = f[k] = 0.0f;
      if (idx >= n) continue;
      const int h = idx / half, i = idx % half;
      const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
      x0[k] = __bfloat162float(xt[h * hs + ia]);
      x1[k] = __bfloat162float(xt[h * hs + ib]);
      f[k] = inv_freq[i];
    }
#pragma unroll
    for (int k = 0; k < kRopePairs; ++k) {
      const int idx = g + k * kRopeThreads + int(threadIdx.x);
      if (idx >= n) continue;
      const int h = idx / half, i = idx % half;
      const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
      const float a = f[k] * p;
      const float c = cosf(a) * af, sn = sinf(a) * af;
      xt[h * hs + ia] = __float2bfloat16(x0[k] * c - x1[k] * sn);
      xt[h * hs + ib] = __float2bfloat16(x1[k] * c + x0[k] * sn);
    }
  }
}

// The previous form (a strided loop, one pair's loads per iteration), for `fp4moe bench rows`.
__global__ void rope_kernel_v0(uint16_t* x, int heads, int64_t ts, int64_t hs, int offset, int half,
                               const int32_t* positions, const float* inv_freq, float af, bool interleaved) {
  const int t = blockIdx.x;
  const float p = float(positions[t]);
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    bf16* v = reinterpret_cast<bf16*>(x + t * ts + h * hs + offset);
    const float a = inv_freq[i] * p;
    const float c = cosf(a) * af, sn = sinf(a) * af;
    const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float x0 = __bfloat162float(v[ia]), x1 = __bfloat162float(v[ib]);
    v[ia] = __float2bfloat16(x0 * c - x1 * sn);
    v[ib] = __float2bfloat16(x1 * c + x0 * sn);
  }
}

}  // namespace
}  // namespace fp4moe::cuda::rope
