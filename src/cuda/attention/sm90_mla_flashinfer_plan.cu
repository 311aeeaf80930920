// FlashInfer's MLA planner (scheduler.cuh MLAPlan) behind MlaSm90::plan: host-side split and
// load-balance schedule for the causal kernel, written into the pinned staging buffer.
#include <exception>
#include <string>

#include <flashinfer/attention/scheduler.cuh>

#include "cuda/attention/sm90_mla_flashinfer.hpp"
#include "cuda/routing/host_check.hpp"

namespace fp4moe::cuda::attention::flashinfer_glue {

Plan plan(void* float_ws, size_t float_bytes, void* int_ws, void* pinned, size_t int_bytes,
          std::vector<int32_t>& q_indptr, std::vector<int32_t>& kv_indptr, std::vector<int32_t>& kv_len,
          int num_heads, cudaStream_t stream) {
  ::flashinfer::MLAPlanInfo info{};
  size_t staged = 0;
  cudaError_t st = cudaSuccess;
  try {
    st = ::flashinfer::MLAPlan<int32_t>(float_ws, float_bytes, int_ws, pinned, int_bytes, info, staged,
                                        q_indptr.data(), kv_indptr.data(), kv_len.data(),
                                        uint32_t(kv_len.size()), uint32_t(num_heads), kCkvDim,
                                        /*causal=*/true, stream);
  } catch (const std::exception& e) {
    fail_invalid(std::string("MLA plan (FlashInfer MLAPlan): ") + e.what());
  }
  require(st == cudaSuccess, std::string("MLA plan (FlashInfer MLAPlan): ") + cudaGetErrorString(st));
  Plan p;
  p.info = info.ToVector();
  p.staged_int_bytes = staged;
  const auto* work_indptr = ::flashinfer::GetPtrFromBaseOffset<int32_t>(pinned, info.work_indptr_offset);
  p.works = work_indptr[info.num_blks_y];
  return p;
}

}  // namespace fp4moe::cuda::attention::flashinfer_glue
