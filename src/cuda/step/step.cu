#include "cuda/step/step.hpp"
#include "cuda/step/step_kernels.cuh"

#include "core/error.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::step {

void chunk_qo_indptr(const int32_t* qo_indptr, int32_t R, int32_t r0, int32_t n, int32_t* out, cudaStream_t s) {
  FP4MOE_CHECK(R >= 1 && r0 >= 0 && n >= 1, "chunk_qo_indptr: {} requests, rows {} + {}", R, r0, n);
  chunk_qo_indptr_kernel<<<1, kChunkQoThreads, 0, s>>>(qo_indptr, R, r0, n, out);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

void count_experts(const int32_t* ids, int T, int k, const int32_t* token_req, const int32_t* active, int E,
                   int32_t* counts, cudaStream_t s) {
  FP4MOE_CHECK(E >= 1 && E <= kCountExpertsMaxExperts && k >= 1, "count_experts: {} experts, top-k {}", E, k);
  count_experts_kernel<<<1, kCountExpertsThreads, size_t(E) * 4, s>>>(ids, T, k, token_req, active, E, counts);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void greedy_advance(const GreedyAdvanceArgs& a, int32_t step, cudaStream_t s) {
  if (a.requests == 0) return;
  greedy_advance_kernel<<<(a.requests + kGreedyAdvanceThreads - 1) / kGreedyAdvanceThreads, kGreedyAdvanceThreads, 0,
                          s>>>(a, step);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void spec_accept_greedy(const cpu::SpecAcceptArgs& a, cudaStream_t s) {
  if (a.requests == 0) return;
  FP4MOE_CHECK(a.max_drafts >= 0 && a.stop_stride >= 0, "spec_accept_greedy: {} drafts, {} stop ids", a.max_drafts,
               a.stop_stride);
  spec_accept_greedy_kernel<<<(a.requests + kSpecAcceptThreads - 1) / kSpecAcceptThreads, kSpecAcceptThreads, 0, s>>>(a);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

void copy_indexed_i32(int32_t* dst, const int32_t* dst_index, const int32_t* src, const int32_t* src_index, int32_t n,
                      cudaStream_t s) {
  if (n <= 0) return;
  copy_indexed_i32_kernel<<<(n + kCopyIndexedThreads - 1) / kCopyIndexedThreads, kCopyIndexedThreads, 0, s>>>(
      dst, dst_index, src, src_index, n);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::step
