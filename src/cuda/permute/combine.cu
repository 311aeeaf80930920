// The combine: out[t, :] = sum_{s<R} y[pair_row[t*R+s], :] (+ shared[t, :]) in FP32, in slot
// order (see permute.hpp). One thread per (token, 8 columns): each CTA covers kCombineThreads
// vectors of one token, so T = 1 at H = 6144 still spreads over 6 CTAs, and every thread
// issues its R row loads back to back (batches of kCombineBatch) before it sums them.
#include <algorithm>

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/permute/bf16_vec.cuh"
#include "cuda/permute/permute.hpp"

namespace fp4moe::cuda {
namespace {

constexpr int kCombineThreads = 128;
constexpr int kCombineBatch = 16;  // row loads in flight per thread

template <typename Out>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(const uint4* __restrict__ y, const int32_t* __restrict__ pair_row, const uint4* __restrict__ shared,
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
    unpack_bf16x8(shared[t * vecs_per_row + v], f);
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

template <typename Out>
void combine_impl(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens, int rows_per_token,
                  int hidden, Out* out, cudaStream_t stream) {
  FP4MOE_CHECK(hidden % 8 == 0, "combine: hidden = {} is not a multiple of 8", hidden);
  FP4MOE_CHECK(rows_per_token >= 0, "combine: rows_per_token = {}", rows_per_token);
  if (tokens <= 0) return;
  const int vecs = hidden / 8;
  const int ctas_per_token = (vecs + kCombineThreads - 1) / kCombineThreads;
  const int64_t grid = int64_t(tokens) * ctas_per_token;
  FP4MOE_CHECK(grid < (int64_t(1) << 31), "combine: {} tokens overflow the grid", tokens);
  combine_kernel<Out><<<unsigned(grid), kCombineThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(y), pair_row, reinterpret_cast<const uint4*>(shared), rows_per_token, vecs,
      ctas_per_token, out);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens, int rows_per_token,
                  int hidden, float* out_f32, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_f32, stream);
}

void combine_rows(const uint16_t* y, const int32_t* pair_row, const uint16_t* shared, int tokens, int rows_per_token,
                  int hidden, uint16_t* out_bf16, cudaStream_t stream) {
  combine_impl(y, pair_row, shared, tokens, rows_per_token, hidden, out_bf16, stream);
}

}  // namespace fp4moe::cuda
