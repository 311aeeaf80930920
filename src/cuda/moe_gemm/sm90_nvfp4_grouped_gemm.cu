// Launcher and the explicit instantiations (block_n = 16, 64, 128, 256) of the sm_90a
// NVFP4/MXFP4 wgmma grouped GEMM; decode launches go to sm90_nvfp4_grouped_gemm_decode.cu.
// Shapes, pointers and the tensor map were checked / built by the host code (moe_gemm.cpp):
// this file only launches.
#include "cuda/moe_gemm/sm90_nvfp4_grouped_gemm.cuh"

#include "cuda/moe_gemm/sm90_launch_params.cuh"

namespace fp4moe::cuda::sm90 {
namespace {

template <int kBlockN>
Sm90KernelResources resources(size_t dynamic_smem) {
  return kernel_resources<sm90_fp4_grouped_gemm_kernel<kBlockN>>(int(kSm90MaxSmemPerBlock), sm90_threads(kBlockN),
                                                                  dynamic_smem);
}

template <int kBlockN>
void launch_n(const Sm90GemmLaunch& a, cudaStream_t stream) {
  static_assert(sizeof(CUtensorMap) == 128);
  set_max_dynamic_smem_once<sm90_fp4_grouped_gemm_kernel<kBlockN>>(int(kSm90MaxSmemPerBlock));
  const Sm90SmemLayout L = sm90_smem_layout(kBlockN, a.stages, a.num_experts);
  const GroupedGemmParams p = sm90_params(a, kBlockN, stream);
  const int grid = sm90_grid(a, p, kBlockN, sm90_ctas_per_sm(kBlockN));
  sm90_fp4_grouped_gemm_kernel<kBlockN>
      <<<grid, sm90_threads(kBlockN), L.total, stream>>>(*static_cast<const CUtensorMap*>(a.x_map), p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_grouped_gemm(const Sm90GemmLaunch& a, cudaStream_t stream) {
  if (a.m_rows <= 0) return;
  if (a.decode) return launch_grouped_gemm_decode(a, stream);
  switch (a.block_n) {
    case 16: return launch_n<16>(a, stream);
    case 64: return launch_n<64>(a, stream);
    case 128: return launch_n<128>(a, stream);
    case 256: return launch_n<256>(a, stream);
    default: return;  // the caller checked sm90_block_n_supported
  }
}

Sm90KernelResources sm90_kernel_resources(bool decode, int block_n, size_t dynamic_smem) {
  if (decode) return sm90_decode_kernel_resources(block_n, dynamic_smem);
  switch (block_n) {
    case 16: return resources<16>(dynamic_smem);
    case 64: return resources<64>(dynamic_smem);
    case 128: return resources<128>(dynamic_smem);
    case 256: return resources<256>(dynamic_smem);
    default: return {};
  }
}

}  // namespace fp4moe::cuda::sm90
