// FlashInfer's planners (scheduler.cuh) behind MlaSm90::plan (MLAPlan) and
// MlaPrefillExpandedSm90::plan (PrefillSM90Plan): host-side split / load-balance schedules for
// the causal kernels, written into the pinned staging buffer.
#include <exception>
#include <string>

#include <flashinfer/attention/scheduler.cuh>

#include "cuda/attention/sm90_mla_flashinfer.hpp"
#include "core/error.hpp"

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
    FP4MOE_FAIL("{}", std::string("MLA plan (FlashInfer MLAPlan): ") + e.what());
  }
  FP4MOE_CHECK(st == cudaSuccess, "{}", std::string("MLA plan (FlashInfer MLAPlan): ") + cudaGetErrorString(st));
  Plan p;
  p.info = info.ToVector();
  p.staged_int_bytes = staged;
  const auto* work_indptr = ::flashinfer::GetPtrFromBaseOffset<int32_t>(pinned, info.work_indptr_offset);
  p.works = work_indptr[info.num_blks_y];
  return p;
}

Plan plan_prefill(void* float_ws, size_t float_bytes, void* int_ws, void* pinned, size_t int_bytes,
                  std::vector<int32_t>& qo_indptr, std::vector<int32_t>& kv_indptr, std::vector<int32_t>& kv_len,
                  int num_heads, cudaStream_t stream) {
  ::flashinfer::PrefillPlanSM90Info info;
  cudaError_t st = cudaSuccess;
  try {
    st = ::flashinfer::PrefillSM90Plan<int32_t>(
        float_ws, float_bytes, int_ws, pinned, int_bytes, info, qo_indptr.data(), kv_indptr.data(), kv_len.data(),
        uint32_t(qo_indptr.back()), uint32_t(kv_len.size()), uint32_t(num_heads), uint32_t(num_heads), 256, 256,
        /*page_size=*/1, /*causal=*/true, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, stream);
  } catch (const std::exception& e) {
    FP4MOE_FAIL("{}", std::string("MLA prefill plan (FlashInfer PrefillSM90Plan): ") + e.what());
  }
  FP4MOE_CHECK(st == cudaSuccess, "{}", std::string("MLA prefill plan (FlashInfer PrefillSM90Plan): ") + cudaGetErrorString(st));
  Plan p;
  p.info = info.ToVector();
  p.staged_int_bytes = 0;  // PrefillSM90Plan copies its schedule to int_ws itself (async, on `stream`)
  return p;
}

}  // namespace fp4moe::cuda::attention::flashinfer_glue
