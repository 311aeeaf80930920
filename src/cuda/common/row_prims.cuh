// Scalar helpers of the row kernels (norm/, rope/, embed/, elementwise/, attention/mla_warp_*,
// indexer/indexer_score_warp_*): BF16 (bits in uint16_t) / FP32 / scaled E4M3 loads and stores, a
// block-wide sum, and the cache slot of (request, position) in a DeviceBatch. Included after
// device_prims.cuh, so the kernels built on it also run in tests/cuda/emu (FP4MOE_CUDA_EMU).
// Internal linkage (unnamed namespace), like the kernels that use it.
#pragma once

#include <cstdint>

#include "cuda/common/device_batch.hpp"
#include "cuda/common/device_prims.cuh"

#if !defined(FP4MOE_CUDA_EMU)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

namespace fp4moe::cuda::rowprims {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void st(uint16_t* p, int64_t i, float v) { reinterpret_cast<bf16*>(p)[i] = __float2bfloat16(v); }

// E4M3 cache element (core/paged_kv.hpp): value = decode(code) * scale; code = RNE(x * inv_scale)
// saturated to +-448 (cpu::kv_encode's order: the reciprocal first, then one multiply).
__device__ __forceinline__ float ld_e4m3(const uint8_t* p, int64_t i, float scale) {
#if defined(FP4MOE_CUDA_EMU)
  return prims::emu_e4m3_to_float(p[i]) * scale;
#else
  return float(reinterpret_cast<const __nv_fp8_e4m3*>(p)[i]) * scale;
#endif
}
__device__ __forceinline__ void st_e4m3(uint8_t* p, int64_t i, float x, float inv_scale) {
  p[i] = uint8_t(prims::float_to_e4m3_bits(x * inv_scale));
}
using prims::warp_sum;

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = lane < int(blockDim.x / 32) ? part[lane] : 0.0f;
    x = warp_sum(x);
    if (lane == 0) total = x;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

__device__ __forceinline__ int64_t slot_of(const DeviceBatch& b, int r, int pos) {
  const int ps = b.page_size;
  return int64_t(b.page_indices[b.page_indptr[r] + pos / ps]) * ps + pos % ps;
}

}  // namespace
}  // namespace fp4moe::cuda::rowprims
