// The one template behind sm90_mla_flashinfer_bf16.cu and _fp8.cu: our MlaRunArgs -> FlashInfer's
// MLAParams, then BatchMLAPageAttentionHopper<kCausal, 512, 64>. Causal covers decode (one query
// at the end of its context sees it all) and sparse rows (q_len 1) too, so one instantiation
// per KV dtype serves every mode.
#pragma once

#include <flashinfer/attention/mla_hopper.cuh>
#include <flashinfer/attention/mla_params.cuh>
#include <flashinfer/allocator.h>
#include <flashinfer/fastdiv.cuh>

#include "cuda/attention/sm90_mla_flashinfer.hpp"

namespace fp4moe::cuda::attention::flashinfer_glue {

template <typename DTypeKV>
cudaError_t run_mla(const Launch& l, const MlaRunArgs& a, cudaStream_t stream) {
  using Params = ::flashinfer::MLAParams<__nv_bfloat16, DTypeKV, __nv_bfloat16, int32_t>;
  using ::flashinfer::GetPtrFromBaseOffset;
  const std::vector<int64_t>& v = *l.info;  // MLAPlanInfo::ToVector() order
  void* iws = l.int_ws;
  Params p{};
  p.q_nope = static_cast<__nv_bfloat16*>(const_cast<void*>(a.q_nope));
  p.q_pe = static_cast<__nv_bfloat16*>(const_cast<void*>(a.q_pe));
  p.ckv = static_cast<DTypeKV*>(a.layer.ckv);
  p.kpe = static_cast<DTypeKV*>(a.layer.kpe);
  p.q_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[2]);
  p.kv_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[3]);
  p.partial_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[4]);
  p.merge_packed_offset_start = GetPtrFromBaseOffset<int32_t>(iws, v[5]);
  p.merge_packed_offset_end = GetPtrFromBaseOffset<int32_t>(iws, v[6]);
  p.merge_partial_packed_offset_start = GetPtrFromBaseOffset<int32_t>(iws, v[7]);
  p.merge_partial_packed_offset_end = GetPtrFromBaseOffset<int32_t>(iws, v[8]);
  p.merge_partial_stride = GetPtrFromBaseOffset<int32_t>(iws, v[9]);
  p.q_len = GetPtrFromBaseOffset<int32_t>(iws, v[10]);
  p.kv_len = GetPtrFromBaseOffset<int32_t>(iws, v[11]);
  p.q_start = GetPtrFromBaseOffset<int32_t>(iws, v[12]);
  p.kv_start = GetPtrFromBaseOffset<int32_t>(iws, v[13]);
  p.kv_end = GetPtrFromBaseOffset<int32_t>(iws, v[14]);
  p.work_indptr = GetPtrFromBaseOffset<int32_t>(iws, v[15]);
  p.partial_o = GetPtrFromBaseOffset<__nv_bfloat16>(l.float_ws, v[16]);
  p.partial_lse = GetPtrFromBaseOffset<float>(l.float_ws, v[17]);
  p.kv_indices = const_cast<int32_t*>(a.kv_indices);
  p.final_o = static_cast<__nv_bfloat16*>(a.out);
  p.final_lse = a.lse;
  p.num_heads = ::flashinfer::uint_fastdiv(uint32_t(l.num_heads));
  p.block_size = ::flashinfer::uint_fastdiv(uint32_t(l.page_size));
  const uint32_t h = uint32_t(l.num_heads), ps = uint32_t(l.page_size);
  p.q_nope_stride_n = h * kCkvDim;
  p.q_nope_stride_h = kCkvDim;
  p.q_pe_stride_n = h * kKpeDim;
  p.q_pe_stride_h = kKpeDim;
  p.ckv_stride_page = ps * kCkvDim;
  p.ckv_stride_n = kCkvDim;
  p.kpe_stride_page = ps * kKpeDim;
  p.kpe_stride_n = kKpeDim;
  p.o_stride_n = h * kCkvDim;
  p.o_stride_h = kCkvDim;
  p.sm_scale = l.sm_scale;
  p.ckv_scale = a.layer.ckv_scale;
  p.kpe_scale = a.layer.kpe_scale;
  p.ckv_scale_arr = nullptr;
  p.return_lse_base_on_e = true;  // natural log, as cpu/attention
  return ::flashinfer::mla::BatchMLAPageAttentionHopper<::flashinfer::MaskMode::kCausal, kCkvDim, kKpeDim>(
      p, uint32_t(v[0]), uint32_t(v[1]), stream);
}

}  // namespace fp4moe::cuda::attention::flashinfer_glue
