// Launcher and the explicit instantiations (block_n = 8, 16, 32) of the sm_90a mma.sync
// decode grouped GEMM (sm90_nvfp4_grouped_gemm_decode.cuh). Checked by moe_gemm.cpp.
#include "cuda/moe_gemm/sm90_nvfp4_grouped_gemm_decode.cuh"

#include <mutex>

#include "cuda/moe_gemm/sm90_launch_params.cuh"

namespace fp4moe::cuda::sm90 {
namespace {

template <int kBlockN>
void launch_decode_n(const Sm90GemmLaunch& a, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_grouped_gemm_decode_kernel<kBlockN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm90_decode_smem_limit())));
  });
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

}  // namespace fp4moe::cuda::sm90
