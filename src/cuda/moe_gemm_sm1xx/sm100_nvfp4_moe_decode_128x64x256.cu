// sm_100a NVFP4 MoE decode GEMM (CUTLASS example 92's recipe), one instantiation: tile 128
// weight rows x 64 tokens x K 256; weights by TMA, activations by cp.async, per-expert slabs
// of max_n rows (sm100_nvfp4_bs_recipe.cuh). Compiled, not run.
#include "cuda/moe_gemm_sm1xx/sm100_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_launch.cuh"

namespace fp4moe::cuda::sm1xx {
const BsKernel& sm100_nvfp4_moe_decode_128x64x256() {
  static const BsKernel k = make_kernel<Sm100Nvfp4MoeDecodeRecipe<64>>();
  return k;
}
}  // namespace fp4moe::cuda::sm1xx
