// sm_100a NVFP4 grouped GEMM, one instantiation: 2-SM tile 256 weight rows (a CTA pair, cluster
// 2x1) x 128 tokens x K 256, stages by StageCountAutoCarveout (sm100_nvfp4_bs_recipe.cuh).
// Compiled, not run.
#include "cuda/moe_gemm_sm1xx/sm100_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_launch.cuh"

namespace fp4moe::cuda::sm1xx {
const BsKernel& sm100_nvfp4_grouped_2sm_256x128x256() {
  static const BsKernel k = make_kernel<Sm100Nvfp4GroupedRecipe<true, 256, 128, 256>>();
  return k;
}
}  // namespace fp4moe::cuda::sm1xx
