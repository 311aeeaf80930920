// sm_100a NVFP4 grouped GEMM, one instantiation: 1-SM tile 128 weight rows x 64 tokens x K 256,
// stages by CUTLASS's StageCountAutoCarveout (sm100_nvfp4_bs_recipe.cuh). Compiled, not run.
#include "cuda/moe_gemm_sm1xx/sm100_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_launch.cuh"

namespace fp4moe::cuda::sm1xx {
const BsKernel& sm100_nvfp4_grouped_1sm_128x64x256() {
  static const BsKernel k = make_kernel<Sm100Nvfp4GroupedRecipe<false, 128, 64, 256>>();
  return k;
}
}  // namespace fp4moe::cuda::sm1xx
