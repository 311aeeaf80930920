// The launch entry of FlashInfer's portable MLA kernel for sm_100a / sm_120a
// (sm1xx_mla_flashinfer_fa2_bf16.cu), for the translation units that already include FlashInfer
// (the glue that builds MLAParams from our plan, as sm90_mla_flashinfer_run.cuh does for the
// Hopper kernel). Compiled, not run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <flashinfer/attention/mla_params.cuh>

namespace fp4moe::cuda::attention::flashinfer_glue {

using MlaParamsBf16 = ::flashinfer::MLAParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int32_t>;

// BatchMLAPagedAttention<kCausal, 512, 64>: causal covers decode, chunked prefill and the sparse
// rows (page_size 1, top-k slots as the page table). blocks_x / blocks_y: MLAPlanInfo's
// num_blks_x / num_blks_y. Returns the launch status.
cudaError_t run_mla_fa2_bf16(const MlaParamsBf16& p, uint32_t blocks_x, uint32_t blocks_y, cudaStream_t stream);

}  // namespace fp4moe::cuda::attention::flashinfer_glue
