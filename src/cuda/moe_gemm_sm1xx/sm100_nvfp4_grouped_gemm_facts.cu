// The CUTLASS types of every sm_100a config the tuner lists (1-SM and 2-SM ptr-array grouped,
// and CUTLASS example 92's MoE decode recipe), read off the types alone (no kernel body is
// instantiated here). Compiled, not run.
#include <vector>

#include "cuda/moe_gemm_sm1xx/sm100_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_facts.cuh"

namespace fp4moe::cuda::sm1xx {

template <int M, int N, int K, int S = 0>
using R100x1 = Sm100Nvfp4GroupedRecipe<false, M, N, K, S>;
template <int M, int N, int K, int S = 0>
using R100x2 = Sm100Nvfp4GroupedRecipe<true, M, N, K, S>;

const std::vector<BsKernelFacts>& sm100_bs_type_facts() {
  static const std::vector<BsKernelFacts> v = {
      facts_of<R100x1<128, 64, 256>>(),  facts_of<R100x1<128, 128, 256>>(), facts_of<R100x1<128, 256, 256>>(),
      facts_of<R100x2<256, 64, 256>>(),  facts_of<R100x2<256, 128, 256>>(), facts_of<R100x2<256, 256, 256>>(),
      facts_of<Sm100Nvfp4MoeDecodeRecipe<64>>(), facts_of<Sm100Nvfp4MoeDecodeRecipe<128>>(),
  };
  return v;
}

}  // namespace fp4moe::cuda::sm1xx
