// FlashInfer SM90 MLA, FP8 E4M3 KV with per-tensor scales: one instantiation (see
// sm90_mla_flashinfer_run.cuh). The kernel dequantizes KV tiles to BF16 in shared memory.
#include <cuda_fp8.h>

#include "cuda/attention/sm90_mla_flashinfer_run.cuh"

namespace fp4moe::cuda::attention::flashinfer_glue {
cudaError_t run_fp8(const Launch& l, const MlaRunArgs& a, cudaStream_t stream) {
  return run_mla<__nv_fp8_e4m3>(l, a, stream);
}
}  // namespace fp4moe::cuda::attention::flashinfer_glue
