// W4A4 emulation: activations fake-quantized to NVFP4 as Blackwell's block-scaled MMA sees
// them (blocks of 16 along K, E4M3 block scale, FP32 per-tensor global), decoded back to
// BF16 WITHOUT the global: x_fq = e2m1 * e4m3_scale, exact in BF16 (<= 6 significant bits).
// The GEMM epilogue multiplies by the global. With the exact W4A16 weight decode, every
// product e2m1_a * s_a * e2m1_w * s_w is exact in the FP32 accumulator, so this pre-pass plus
// the W4A16 kernel reproduces Blackwell's W4A4 numerics up to FP32 summation order.
// Quantization follows format/fp4.cpp's quantize_nvfp4 (ModelOpt) operation for operation:
//   s = block_amax / (6 * g); 0 -> 1; clamp [2^-9, 448]; E4M3 (RNE); q = e2m1_rne(x / (s * g)).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/cuda_check.hpp"
#include "cuda/moe_gemm/moe_gemm.hpp"

namespace fp4moe::cuda {
namespace {

constexpr float kNvfp4GlobalDivisor = 2688.0f;  // 6 * 448

__global__ void amax_bf16_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, unsigned int* __restrict__ out) {
  float m = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));  // non-negative: int order
}

__global__ void finish_global_kernel(float* g) {
  const float amax = __uint_as_float(*reinterpret_cast<unsigned int*>(g));
  *g = amax > 0.0f ? amax / kNvfp4GlobalDivisor : 1.0f;
}

// Round half to even onto {0, .5, 1, 1.5, 2, 3, 4, 6} (saturating), as e2m1_from_float_nvfp4.
__device__ __forceinline__ float e2m1_round(float v) {
  const float a = fabsf(v);
  float r;
  if (a <= 0.25f) r = 0.0f;
  else if (a < 0.75f) r = 0.5f;
  else if (a <= 1.25f) r = 1.0f;
  else if (a < 1.75f) r = 1.5f;
  else if (a <= 2.5f) r = 2.0f;
  else if (a < 3.5f) r = 3.0f;
  else if (a <= 5.0f) r = 4.0f;
  else r = 6.0f;
  return v < 0.0f ? -r : r;
}

// One thread per block of 16 values.
__global__ void fake_quant_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t blocks,
                                  const float* __restrict__ act_global) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const float g = *act_global;
  const uint4* src = reinterpret_cast<const uint4*>(x + b * 16);
  uint4 raw[2] = {src[0], src[1]};
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(raw);
  float f[16];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    f[i] = __bfloat162float(v[i]);
    amax = fmaxf(amax, fabsf(f[i]));
  }
  uint4 out[2];
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(out);
  if (g == 0.0f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] = __float2bfloat16_rn(0.0f);
  } else {
    const float gs6 = 6.0f * g;
    float s = amax / gs6;
    if (s == 0.0f) s = 1.0f;
    s = fminf(fmaxf(s, 0.001953125f), 448.0f);
    const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
    const float sq = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
    const float denom = sq * g;
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] = __float2bfloat16_rn(e2m1_round(f[i] / denom) * sq);
  }
  uint4* dst = reinterpret_cast<uint4*>(y + b * 16);
  dst[0] = out[0];
  dst[1] = out[1];
}

}  // namespace

void compute_act_global_scale(const void* x, int64_t rows, int64_t k, float* act_global_out, cudaStream_t stream) {
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(act_global_out, 0, sizeof(float), stream));
  const int64_t n = rows * k;
  if (n > 0) {
    const int grid = int(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
    amax_bf16_kernel<<<grid, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), n,
                                                reinterpret_cast<unsigned int*>(act_global_out));
    FP4MOE_CUDA_CHECK_LAUNCH();
  }
  finish_global_kernel<<<1, 1, 0, stream>>>(act_global_out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void fake_quantize_activations_nvfp4(const void* x, void* x_fq, int64_t rows, int64_t k, const float* act_global,
                                     cudaStream_t stream) {
  const int64_t blocks = rows * k / 16;  // k % 16 == 0: checked by the caller
  if (blocks == 0) return;
  fake_quant_kernel<<<int((blocks + 255) / 256), 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                                    static_cast<__nv_bfloat16*>(x_fq), blocks,
                                                                    act_global);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda
