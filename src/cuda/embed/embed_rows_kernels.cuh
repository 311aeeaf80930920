// The kernels behind embed.hpp. Kernels only: embed_rows.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
//
// Vector forms (the launch's choice when the rows allow 16-byte stores / loads): grid
// (CTAs per row, rows); a thread copies up to kRowCopyChunks chunks, every load of them issued
// before the first store. embed: a chunk is 4 values (BF16 table: an 8-byte load; FP32: 16 B;
// the FP32 output a 16-byte store). gather: a chunk is 8 BF16 values (16 B each way).
// Scalar forms (any dims and alignments): one CTA per row, a strided loop.
#pragma once

#include "cuda/common/device_prims.cuh"
#include "cuda/common/row_prims.cuh"

namespace fp4moe::cuda::embed {

inline constexpr int kEmbedThreads = 256;
inline constexpr int kGatherThreads = 256;
inline constexpr int kRowCopyChunks = 4;  // chunks per thread in flight in the vector forms

// CTAs per row of the vector forms for `chunks` chunks a row.
inline int row_copy_ctas(int64_t chunks, int threads) {
  return int((chunks + int64_t(threads) * kRowCopyChunks - 1) / (int64_t(threads) * kRowCopyChunks));
}
// Whether the vector embed applies: H a multiple of 4, the table and x 16-byte aligned.
inline bool embed_vec_ok(const void* table, int H, const float* x) {
  return H % 4 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}
// Whether the vector gather applies: dim a multiple of 8, both 16-byte aligned.
inline bool gather_vec_ok(const uint16_t* src, int dim, const uint16_t* dst) {
  return dim % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
}

namespace {

using rowprims::ld;

// Grid (row_copy_ctas(H / 4, kEmbedThreads), T).
template <bool kF32Table>
__global__ void __launch_bounds__(kEmbedThreads) embed_vec_kernel(const void* table, const int32_t* tokens, int H, float* x) {
  const int t = int(blockIdx.y), chunks = H / 4;
  const int64_t row = int64_t(tokens[t]) * H;
  const int c0 = int(blockIdx.x) * kEmbedThreads * kRowCopyChunks + int(threadIdx.x);
  float4 v[kRowCopyChunks] = {};
#pragma unroll
  for (int k = 0; k < kRowCopyChunks; ++k) {
    const int c = c0 + k * kEmbedThreads;
    if (c >= chunks) continue;
    if constexpr (kF32Table) {
      v[k] = reinterpret_cast<const float4*>(static_cast<const float*>(table) + row)[c];
    } else {
      const uint2 b = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(table) + row)[c];
      v[k] = float4{prims::bf16_bits_to_float(b.x & 0xffffu), prims::bf16_bits_to_float(b.x >> 16),
                    prims::bf16_bits_to_float(b.y & 0xffffu), prims::bf16_bits_to_float(b.y >> 16)};
    }
  }
  float4* out = reinterpret_cast<float4*>(x + int64_t(t) * H);
#pragma unroll
  for (int k = 0; k < kRowCopyChunks; ++k) {
    const int c = c0 + k * kEmbedThreads;
    if (c < chunks) out[c] = v[k];
  }
}

// Grid (row_copy_ctas(dim / 8, kGatherThreads), n).
__global__ void __launch_bounds__(kGatherThreads) gather_vec_kernel(const uint16_t* src, int dim, const int32_t* rows,
                                                                     uint16_t* dst) {
  const int chunks = dim / 8;
  const uint4* s = reinterpret_cast<const uint4*>(src + int64_t(rows[blockIdx.y]) * dim);
  uint4* d = reinterpret_cast<uint4*>(dst + int64_t(blockIdx.y) * dim);
  const int c0 = int(blockIdx.x) * kGatherThreads * kRowCopyChunks + int(threadIdx.x);
  uint4 v[kRowCopyChunks] = {};
#pragma unroll
  for (int k = 0; k < kRowCopyChunks; ++k) {
    const int c = c0 + k * kGatherThreads;
    if (c < chunks) v[k] = s[c];
  }
#pragma unroll
  for (int k = 0; k < kRowCopyChunks; ++k) {
    const int c = c0 + k * kGatherThreads;
    if (c < chunks) d[c] = v[k];
  }
}

__global__ void embed_kernel(const void* table, bool f32, const int32_t* tokens, int H, float* x) {
  const int t = blockIdx.x;
  const int64_t row = int64_t(tokens[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x)
    x[int64_t(t) * H + i] = f32 ? static_cast<const float*>(table)[row + i] : ld(static_cast<const uint16_t*>(table), row + i);
}

__global__ void gather_kernel(const uint16_t* src, int dim, const int32_t* rows, uint16_t* dst) {
  const int64_t s = int64_t(rows[blockIdx.x]) * dim, d = int64_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[d + i] = src[s + i];
}

}  // namespace
}  // namespace fp4moe::cuda::embed
