// Launches of the MLA decode kernels (mla_decode_mma.cuh), one instantiation per cache type.
// Compiled for every arch in CMAKE_CUDA_ARCHITECTURES (mma.sync, cp.async, ldmatrix, the
// E4M3 -> FP16 cvt of sm_89+); mla_decode_can_implement checks the shared memory at run time.
#include "cuda/attention/mla_decode_mma.cuh"

namespace fp4moe::cuda::attention::decode {

cudaError_t launch(bool fp8, const Params& p, int items, int head_groups, int merges, cudaStream_t stream) {
  const size_t smem = smem_bytes(fp8);
  auto kernel = fp8 ? mla_decode_kernel<true> : mla_decode_kernel<false>;
  cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (st != cudaSuccess) return st;
  kernel<<<dim3(unsigned(items), unsigned(head_groups)), kThreads, smem, stream>>>(p);
  st = cudaGetLastError();
  if (st != cudaSuccess || merges == 0) return st;
  mla_merge_kernel<<<dim3(unsigned(merges), unsigned(p.num_heads)), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fp4moe::cuda::attention::decode
