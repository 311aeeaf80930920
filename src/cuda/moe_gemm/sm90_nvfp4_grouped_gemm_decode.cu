// Launcher and the explicit instantiations (block_n = 8, 16, 32) of the sm_90a mma.sync
// decode grouped GEMM (sm90_nvfp4_grouped_gemm_decode.cuh). Checked by moe_gemm.cpp.
#include "cuda/moe_gemm/sm90_nvfp4_grouped_gemm_decode.cuh"

#include "cuda/moe_gemm/sm90_launch_params.cuh"

namespace fp4moe::cuda::sm90 {
namespace {

template <int kBlockN>
Sm90KernelResources resources(size_t dynamic_smem) {
  return kernel_resources<sm90_fp4_grouped_gemm_decode_kernel<kBlockN>>(int(sm90_decode_smem_limit()), kDecodeThreads,
                                                                         dynamic_smem);
}

template <int kBlockN>
void launch_decode_n(const Sm90GemmLaunch& a, cudaStream_t stream) {
  set_max_dynamic_smem_once<sm90_fp4_grouped_gemm_decode_kernel<kBlockN>>(int(sm90_decode_smem_limit()));
  const Sm90SmemLayout L = sm90_smem_layout(kBlockN, a.stages, a.num_experts);
  const GroupedGemmParams p = sm90_params(a, kBlockN, stream);
  const int grid = sm90_grid(a, p, kBlockN, kDecodeCtasPerSm);
  sm90_fp4_grouped_gemm_decode_kernel<kBlockN>
      <<<grid, kDecodeThreads, L.total, stream>>>(*static_cast<const CUtensorMap*>(a.x_map), p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_grouped_gemm_decode(const Sm90GemmLaunch& a, cudaStream_t stream) {
  switch (a.block_n) {
    case 8: return launch_decode_n<8>(a, stream);
    case 16: return launch_decode_n<16>(a, stream);
    case 32: return launch_decode_n<32>(a, stream);
    default: return;  // the caller checked sm90_decode_block_n_supported
  }
}

Sm90KernelResources sm90_decode_kernel_resources(int block_n, size_t dynamic_smem) {
  switch (block_n) {
    case 8: return resources<8>(dynamic_smem);
    case 16: return resources<16>(dynamic_smem);
    case 32: return resources<32>(dynamic_smem);
    default: return {};
  }
}

}  // namespace fp4moe::cuda::sm90
