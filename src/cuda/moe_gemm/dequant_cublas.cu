// Kernels of the DequantCublas baseline (host side in dequant_cublas.cpp): whole-expert
// FP4 -> BF16 dequantization, and the two epilogue passes that follow cuBLAS.
#include <cuda_bf16.h>

#include "cuda/moe_gemm/linear_fp4_decode.cuh"
#include "cuda/moe_gemm/linear_fp4_kernels.hpp"

namespace fp4moe::cuda::linear_fp4 {
namespace {

constexpr int kDequantThreads = 256;
constexpr int kEpiThreads = 256;

// One thread = one 16-element chunk (8 packed bytes -> 32 BF16 bytes). K % block == 0, so
// the chunk's scale index is (chunk * 16) / block over the whole [N, K/block] matrix.
template <bool kMx>
__global__ void __launch_bounds__(kDequantThreads) dequant_experts_kernel(DequantParams p) {
  const int64_t chunks = p.n * p.k / 16;
  const int64_t expert = p.experts[blockIdx.y];
  const uint2* src = reinterpret_cast<const uint2*>(p.packed + expert * p.n * (p.k / 2));  // [N*K/16]
  const uint8_t* sc = p.scales + expert * p.n * (p.k / (kMx ? 32 : 16));
  uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) +
                                        int64_t(blockIdx.y) * p.n * p.k);  // [N*K/8]
  for (int64_t c = blockIdx.x * int64_t(kDequantThreads) + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * kDequantThreads) {
    const uint2 v = src[c];
    const float s = scale_to_float<kMx>(sc[kMx ? c / 2 : c]);
    uint32_t o[8];
    decode16_bf16(v, s, o);
    dst[2 * c] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[2 * c + 1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__global__ void __launch_bounds__(kEpiThreads)
silu_mul_rows_kernel(const __nv_bfloat16* t, __nv_bfloat16* y, int64_t row_begin, int64_t rows, int half) {
  const int64_t total = rows * half;
  for (int64_t i = blockIdx.x * int64_t(kEpiThreads) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kEpiThreads) {
    const int64_t m = row_begin + i / half;
    const int j = int(i % half);
    const float g = __bfloat162float(t[m * 2 * half + j]);
    const float u = __bfloat162float(t[m * 2 * half + half + j]);
    y[m * half + j] = __float2bfloat16_rn(silu(g) * u);
  }
}

__global__ void __launch_bounds__(kEpiThreads)
row_scale_rows_kernel(__nv_bfloat16* y, const float* rs, int64_t row_begin, int64_t rows, int n) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(kEpiThreads) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kEpiThreads) {
    const int64_t m = row_begin + i / n;
    const int64_t idx = m * n + i % n;
    y[idx] = __float2bfloat16_rn(__bfloat162float(y[idx]) * rs[m]);
  }
}

unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return unsigned(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

}  // namespace

cudaError_t launch_dequant_experts(const DequantParams& p, cudaStream_t stream) {
  if (p.slots <= 0) return cudaSuccess;
  const int64_t chunks = p.n * p.k / 16;
  int64_t bx = (chunks + kDequantThreads - 1) / kDequantThreads;
  if (bx > 4096) bx = 4096;  // grid-stride beyond: ~64 chunks per thread for GLM-5 experts
  const dim3 grid(unsigned(bx), unsigned(p.slots));
  if (p.mx) {
    dequant_experts_kernel<true><<<grid, kDequantThreads, 0, stream>>>(p);
  } else {
    dequant_experts_kernel<false><<<grid, kDequantThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t launch_silu_mul_rows(const void* t, void* y, int64_t row_begin, int64_t row_end, int half,
                                 cudaStream_t stream) {
  const int64_t rows = row_end - row_begin;
  if (rows <= 0) return cudaSuccess;
  silu_mul_rows_kernel<<<grid_for(rows * half, kEpiThreads), kEpiThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(t), static_cast<__nv_bfloat16*>(y), row_begin, rows, half);
  return cudaGetLastError();
}

cudaError_t launch_row_scale_rows(void* y, const float* row_scale, int64_t row_begin, int64_t row_end,
                                  int n, cudaStream_t stream) {
  const int64_t rows = row_end - row_begin;
  if (rows <= 0) return cudaSuccess;
  row_scale_rows_kernel<<<grid_for(rows * n, kEpiThreads), kEpiThreads, 0, stream>>>(
      static_cast<__nv_bfloat16*>(y), row_scale, row_begin, rows, n);
  return cudaGetLastError();
}

}  // namespace fp4moe::cuda::linear_fp4
