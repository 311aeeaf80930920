// sm_120a NVFP4 grouped GEMM, one instantiation: tile 128 weight rows x 64 tokens x K 128,
// stages by CUTLASS's StageCountAutoCarveout (sm120_nvfp4_bs_recipe.cuh). Compiled, not run.
#include "cuda/moe_gemm_sm1xx/sm120_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_launch.cuh"

namespace fp4moe::cuda::sm1xx {
const BsKernel& sm120_nvfp4_grouped_128x64x128() {
  static const BsKernel k = make_kernel<Sm120Nvfp4GroupedRecipe<128, 64, 128>>();
  return k;
}
}  // namespace fp4moe::cuda::sm1xx
