// FlashInfer's SM90 (FA3) ragged prefill, BF16, head_dim 256 / 256, causal, standard softmax,
// per-head schedule: one instantiation, behind MlaPrefillExpandedSm90 (mla_prefill.cpp). The
// expanded MLA heads are [k_nope 192 | k_rope 64] against [q_nope 192 | q_rope 64], v 256.
#include <flashinfer/allocator.h>
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/cutlass_utils.cuh>

#include "cuda/attention/sm90_mla_flashinfer.hpp"

namespace fp4moe::cuda::attention::flashinfer_glue {

cudaError_t run_prefill_expanded_bf16(const PrefillLaunch& l, cudaStream_t stream) {
  using Bf16 = ::flashinfer::cutlass_dtype_t<__nv_bfloat16>;
  using Params = ::flashinfer::BatchPrefillRaggedParams<Bf16, Bf16, Bf16, int32_t>;
  using ::flashinfer::GetPtrFromBaseOffset;
  const std::vector<int64_t>& v = *l.info;  // PrefillPlanSM90Info::ToVector() order
  if (v.size() < 9 || v[8] != 0) return cudaErrorNotSupported;  // same_schedule_for_all_heads: not instantiated
  void* iws = l.int_ws;
  Params p{};
  p.q_ptr = static_cast<Bf16*>(const_cast<void*>(l.q));
  p.k_ptr = static_cast<Bf16*>(l.k);
  p.v_ptr = static_cast<Bf16*>(l.v);
  p.o_ptr = static_cast<Bf16*>(l.o);
  p.lse_ptr = l.lse;
  p.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(iws, v[0]);
  p.qo_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[1]);
  p.kv_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[2]);
  p.qo_lens = GetPtrFromBaseOffset<int32_t>(iws, v[3]);
  p.kv_lens = GetPtrFromBaseOffset<int32_t>(iws, v[4]);
  p.head_indices = GetPtrFromBaseOffset<int32_t>(iws, v[5]);
  p.work_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[6]);
  p.batch_indices = GetPtrFromBaseOffset<int32_t>(iws, v[7]);
  p.additional_params.logits_soft_cap = 0.f;
  p.additional_params.sm_scale = l.sm_scale;
  p.additional_params.maybe_prefix_len_ptr = nullptr;
  p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  p.additional_params.token_pos_in_items_len = 0;
  p.additional_params.maybe_max_item_len_ptr = nullptr;
  p.q_stride_n = l.q_stride_n;
  p.q_stride_h = l.q_stride_h;
  p.k_stride_n = l.kv_stride_n;
  p.k_stride_h = l.kv_stride_h;
  p.v_stride_n = l.kv_stride_n;
  p.v_stride_h = l.kv_stride_h;
  p.o_stride_n = l.o_stride_n;
  p.o_stride_h = l.o_stride_h;
  p.nnz_qo = l.nnz_qo;
  p.nnz_kv = l.nnz_kv;
  p.num_qo_heads = l.num_heads;
  p.num_kv_heads = l.num_heads;
  p.group_size = 1;
  p.window_left = -1;
  p.causal = true;
  return ::flashinfer::BatchPrefillWithRaggedKVCacheDispatched<256, 256, ::flashinfer::MaskMode::kCausal,
                                                               /*LEFT_SLIDING_WINDOW=*/false,
                                                               /*SAME_SCHEDULE_FOR_ALL_HEADS=*/false,
                                                               ::flashinfer::StandardAttention>(p, false, stream);
}

}  // namespace fp4moe::cuda::attention::flashinfer_glue
