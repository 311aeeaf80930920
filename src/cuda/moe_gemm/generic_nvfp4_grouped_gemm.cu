// GemmKernel::Generic: the launch (kernel in generic_nvfp4_grouped_gemm_kernels.cuh, host side in
// generic_nvfp4_grouped_gemm.cpp).
#include "cuda/moe_gemm/generic_nvfp4_grouped_gemm_kernels.cuh"

namespace fp4moe::cuda::linear_fp4 {

cudaError_t launch_generic_grouped_gemm(const GenericParams& p, cudaStream_t stream) {
  const bool silu = p.epilogue == kEpiSiluMul;
  const int tiles = silu ? (p.n / 2 + kHalfW - 1) / kHalfW : (p.n + kRowsW - 1) / kRowsW;
  const dim3 grid(unsigned(tiles), unsigned(p.num_experts));
  if (p.mx) {
    generic_fp4_grouped_gemm_kernel<true><<<grid, kThreads, 0, stream>>>(p);
  } else {
    generic_fp4_grouped_gemm_kernel<false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace fp4moe::cuda::linear_fp4
