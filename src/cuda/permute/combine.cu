// The combine: out[t, :] = sum_{s<R} y[pair_row[t*R+s], :] (+ shared[t, :], bf16 or f32) in
// FP32, in slot order (see permute.hpp); and the BF16 shared expert's SiLU(gate)·up. Combine:
// one thread per (token, 8 columns): each CTA covers kCombineThreads vectors of one token, so
// T = 1 at H = 6144 still spreads over 6 CTAs, and every thread issues its R row loads back to
// back (batches of kCombineBatch) before it sums them.
#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/permute/bf16_vec.cuh"
#include "cuda/permute/permute.hpp"

namespace fp4moe::cuda {
namespace {

constexpr int kCombineThreads = 128;
constexpr int kCombineBatch = 16;  // row loads in flight per thread

// The shared row's 8 values of vector v: bf16 (one uint4) or f32 (two float4).
__device__ __forceinline__ void load_shared8(const uint16_t* shared, int64_t vec, float (&f)[8]) {
  unpack_bf16x8(reinterpret_cast<const uint4*>(shared)[vec], f);
}
__device__ __forceinline__ void load_shared8(const float* shared, int64_t vec, float (&f)[8]) {
  const float4* p = reinterpret_cast<const float4*>(shared) + 2 * vec;
  const float4 a = p[0], b = p[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

template <typename Out, typename Shared>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(const uint4* __restrict__ y, const int32_t* __restrict__ pair_row, const Shared* __restrict__ shared,
               int rows_per_token, int vecs_per_row, int ctas_per_token, Out* __restrict__ out) {
  const int64_t t = blockIdx.x / ctas_per_token;
  const int v = (blockIdx.x - int(t * ctas_per_token)) * kCombineThreads + threadIdx.x;
  if (v >= vecs_per_row) return;
  const int32_t* rows = pair_row + t * rows_per_token;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int s0 = 0; s0 < rows_per_token; s0 += kCombineBatch) {
    uint4 in[kCombineBatch];
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i)
      if (s0 + i < rows_per_token) in[i] = y[int64_t(rows[s0 + i]) * vecs_per_row + v];
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i)
      if (s0 + i < rows_per_token) {
        float f[8];
        unpack_bf16x8(in[i], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += f[j];
      }
  }
  if (shared) {
    float f[8];
    load_shared8(shared, t * vecs_per_row + v, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += f[j];
  }
  if constexpr (sizeof(Out) == 4) {
    float4* o = reinterpret_cast<float4*>(out) + (t * vecs_per_row + v) * 2;
    o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else {
    reinterpret_cast<uint4*>(out)[t * vecs_per_row + v] = pack_bf16x8(acc);
  }
}

template <typename Out, typename Shared>
void combine_impl(const uint16_t* y, const int32_t* pair_row, const Shared* shared, int tokens, int rows_per_token,
                  int hidden, Out* out, cudaStream_t stream) {
  FP4MOE_CHECK(hidden % 8 == 0, "combine: hidden = {} is not a multiple of 8", hidden);
  FP4MOE_CHECK(rows_per_token >= 0, "combine: rows_per_token = {}", rows_per_token);
  if (tokens <= 0) return;
  const int vecs = hidden / 8;
  const int ctas_per_token = (vecs + kCombineThreads - 1) / kCombineThreads;
  const int64_t grid = int64_t(tokens) * ctas_per_token;
  FP4MOE_CHECK(grid < (int64_t(1) << 31), "combine: {} tokens overflow the grid", tokens);
  combine_kernel<Out, Shared><<<unsigned(grid), kCombineThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(y), pair_row, shared, rows_per_token, vecs, ctas_per_token, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

constexpr int kSiluThreads = 256;

// h[t, j] = bf16(SiLU(gu[t, j]) · gu[t, inter + j]), 4 columns per thread (inter % 4 == 0).
__global__ void __launch_bounds__(kSiluThreads)
silu_mul_kernel(const float* __restrict__ gu, int64_t quads, int inter, uint16_t* __restrict__ h) {
  const int64_t q = int64_t(blockIdx.x) * kSiluThreads + threadIdx.x;
  if (q >= quads) return;
  const int quads_per_row = inter / 4;
  const int64_t t = q / quads_per_row;
  const int j = int(q - t * quads_per_row) * 4;
  const float4 g = *reinterpret_cast<const float4*>(gu + t * 2 * inter + j);
  const float4 u = *reinterpret_cast<const float4*>(gu + t * 2 * inter + inter + j);
  const float gv[4] = {g.x, g.y, g.z, g.w}, uv[4] = {u.x, u.y, u.z, u.w};
  float r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = gv[i] / (1.0f + expf(-gv[i])) * uv[i];
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(h + t * inter + j);
  o[0] = __floats2bfloat162_rn(r[0], r[1]);
  o[1] = __floats2bfloat162_rn(r[2], r[3]);
}

}  // namespace

void silu_mul_rows(const float* gate_up, int tokens, int inter, uint16_t* h, cudaStream_t stream) {
  FP4MOE_CHECK(inter > 0 && inter % 4 == 0, "silu_mul_rows: inter = {} is not a positive multiple of 4", inter);
  if (tokens <= 0) return;
  const int64_t quads = int64_t(tokens) * (inter / 4);
  const int64_t grid = (quads + kSiluThreads - 1) / kSiluThreads;
  FP4MOE_CHECK(grid < (int64_t(1) << 31), "silu_mul_rows: {} tokens overflow the grid", tokens);
  silu_mul_kernel<<<unsigned(grid), kSiluThreads, 0, stream>>>(gate_up, quads, inter, h);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void combine_rows_f32_shared(const uint16_t* y, const int32_t* pair_row, const float* shared, int tokens,
                             int rows_per_token, int hidden, float* out_f32, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_f32, stream);
}

void combine_rows_f32_shared(const uint16_t* y, const int32_t* pair_row, const float* shared, int tokens,
                             int rows_per_token, int hidden, uint16_t* out_bf16, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_bf16, stream);
}

void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens, int rows_per_token,
                  int hidden, float* out_f32, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_f32, stream);
}

void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens, int rows_per_token,
                  int hidden, uint16_t* out_bf16, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_bf16, stream);
}

}  // namespace fp4moe::cuda
