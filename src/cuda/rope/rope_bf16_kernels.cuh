// The kernel behind rope.hpp (BF16 in place, FP32 angles). Kernels only: rope_bf16.cu launches
// it, tests/ops/backend_ops_emu_test runs it through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::rope {

inline constexpr int kRopeThreads = 256;

namespace {

using rowprims::bf16;

// One CTA per token, a strided loop over its heads · half pairs. (A form that loaded 8 pairs per
// thread before rotating any took 8.6 us at B 1 against this loop's 7.4 us, warm, on an H100:
// bench/RESULTS.md, 2026-12-07 sixth session; not profiled further.)
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(uint16_t* x, int heads, int64_t ts, int64_t hs, int offset,
                                                            int half, const int32_t* positions, const float* inv_freq,
                                                            float af, bool interleaved) {
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
