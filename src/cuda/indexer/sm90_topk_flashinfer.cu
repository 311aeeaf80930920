// The wrapper of topk_flashinfer.hpp: FlashInfer's TopKPageTableTransformDispatch<float, int32>
// with its configurable page-table policy (score stride, log2 page size, raw positions out).
// One instantiation, compiled for sm_90a with the other FlashInfer objects.
#include "cuda/indexer/topk_flashinfer.hpp"

#include <flashinfer/math.cuh>  // topk.cuh uses math:: without including it
#include <flashinfer/topk.cuh>

#include "core/error.hpp"
#include "cuda/attention/kv_dims.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda::indexer {
// One RadixRowState per CTA group of the multi-CTA kernel (at most one group per SM).
size_t flashinfer_top_k_workspace_bytes() {
  return size_t(current_device().sm_count) * sizeof(flashinfer::sampling::RadixRowState);
}

std::string flashinfer_top_k_can_implement(const FlashInferTopKArgs& a) {
  if (current_device().cc / 10 != 9) return "FlashInfer's top-k is built for sm_90a only";
  if (a.top_k < 1 || a.top_k > int(flashinfer::sampling::FILTERED_TOPK_MAX_K))
    return "FlashInfer's top-k takes k <= 2048";
  if (attention::log2_exact(a.page_size) < 0) return "page_size must be a power of two";
  return "";
}

void flashinfer_top_k(const FlashInferTopKArgs& a, cudaStream_t stream) {
  const std::string why = flashinfer_top_k_can_implement(a);
  FP4MOE_CHECK(why.empty(), "FlashInfer top-k: {}", why);
  FP4MOE_CHECK(a.scores && a.lengths && a.page_starts && a.page_indices && a.out_slot && a.rows >= 1 &&
                   a.max_ctx >= 1 && a.score_stride >= a.max_ctx,
               "{}", "FlashInfer top-k: a required pointer is null or a size is out of range");
  FP4MOE_CHECK(a.workspace && a.workspace_bytes >= flashinfer_top_k_workspace_bytes(),
               "FlashInfer top-k: the workspace needs {} bytes", flashinfer_top_k_workspace_bytes());
  using Policy = flashinfer::sampling::ConfigurablePageTableKernelPolicy<int32_t>;
  const Policy policy(a.out_pos, a.score_stride, uint32_t(attention::log2_exact(a.page_size)));
  // src_stride 0 and no row_to_batch: every row reads the one CSR array from its own start.
  const cudaError_t e = flashinfer::sampling::TopKPageTableTransformDispatch<float, int32_t, Policy>(
      const_cast<float*>(a.scores), a.out_slot, a.page_indices, /*src_stride=*/0, const_cast<int32_t*>(a.lengths),
      /*row_starts=*/nullptr, /*row_to_batch=*/nullptr, uint32_t(a.rows), uint32_t(a.top_k), uint32_t(a.max_ctx),
      static_cast<flashinfer::sampling::RadixRowState*>(a.workspace), /*deterministic=*/false,
      flashinfer::sampling::TopKTieBreak::None, stream, /*dsa_graph_safe=*/false, a.page_starts, policy);
  FP4MOE_CUDA_CHECK(e);
}

}  // namespace fp4moe::cuda::indexer
