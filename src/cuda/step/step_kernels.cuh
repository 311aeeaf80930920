// The kernels behind step.hpp. Kernels only: step.cu launches them,
// tests/ops/backend_ops_emu_test runs them through the CUDA emulator.
#pragma once

#include "cuda/common/device_prims.cuh"

#include "cuda/step/greedy_advance_args.hpp"
#include "core/spec_accept.hpp"

namespace fp4moe::cuda::step {

inline constexpr int kCountExpertsThreads = 512;
inline constexpr int kGreedyAdvanceThreads = 128;
inline constexpr int kChunkQoThreads = 256;
inline constexpr int kSpecAcceptThreads = 128;
inline constexpr int kCopyIndexedThreads = 256;

namespace {

__global__ void count_experts_kernel(const int32_t* ids, int T, int k, const int32_t* token_req,
                                     const int32_t* active, int E, int32_t* counts) {
  FP4MOE_DYNAMIC_SMEM(int32_t, bins);
  for (int e = threadIdx.x; e < E; e += blockDim.x) bins[e] = 0;
  __syncthreads();
  const int n = T * k;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E && active[token_req[i / k]] != 0) atomicAdd(&bins[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = bins[e];
}

__global__ void greedy_advance_kernel(GreedyAdvanceArgs a, int32_t j) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.requests) return;
  int32_t* out = a.out + int64_t(j) * a.requests + r;
  if (a.active[r] == 0) {
    *out = -1;
    return;
  }
  const int32_t t = a.greedy[r];
  *out = t;
  const int32_t n = a.produced[r] + 1;
  a.produced[r] = n;
  if (a.draw) {
    a.draw[r] += 1;
    const int32_t o = a.output_len[r];
    const int64_t at = int64_t(a.prompt_len[r]) + o;
    if (a.history && at < a.history_stride) a.history[int64_t(r) * a.history_stride + at] = t;
    a.output_len[r] = o + 1;
  }
  if (cpu::launch_finishes(t, n, a.max_new[r], a.stop_ids + int64_t(r) * a.stop_stride, a.stop_stride)) {
    a.active[r] = 0;
    if (a.done) a.done[r] = 1;
    a.positions[r] = 0;
    a.kv_len[r] = 1;
    a.page_indices[a.page_indptr[r]] = a.trash_page;
    return;
  }
  a.tokens[r] = t;
  a.positions[r] += 1;
  a.kv_len[r] += 1;
}

__global__ void spec_accept_greedy_kernel(cpu::SpecAcceptArgs a) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < a.requests) cpu::spec_accept_greedy_row(a, r);
}

__global__ void copy_indexed_i32_kernel(int32_t* dst, const int32_t* dst_index, const int32_t* src,
                                        const int32_t* src_index, int32_t n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t d = dst_index ? dst_index[i] : i, q = src_index ? src_index[i] : i;
  if (d >= 0 && q >= 0) dst[d] = src[q];
}

__global__ void chunk_qo_indptr_kernel(const int32_t* qo, int32_t R, int32_t r0, int32_t n, int32_t* out) {
  for (int32_t i = int32_t(threadIdx.x); i <= R; i += int32_t(blockDim.x)) out[i] = min(max(qo[i] - r0, 0), n);
}

}  // namespace
}  // namespace fp4moe::cuda::step
