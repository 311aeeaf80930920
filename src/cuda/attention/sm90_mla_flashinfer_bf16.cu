// FlashInfer SM90 MLA, BF16 KV: one instantiation (see sm90_mla_flashinfer_run.cuh).
#include <cuda_bf16.h>

#include "cuda/attention/sm90_mla_flashinfer_run.cuh"

namespace fp4moe::cuda::attention::flashinfer_glue {
cudaError_t run_bf16(const Launch& l, const MlaRunArgs& a, cudaStream_t stream) {
  return run_mla<__nv_bfloat16>(l, a, stream);
}
}  // namespace fp4moe::cuda::attention::flashinfer_glue
