// The CUTLASS types of every sm_120a config the tuner lists, read off the types alone (no
// kernel body is instantiated here): shared storage, resolved stage count, pieces. The tuner's
// sm_120 shared-memory verdicts come from this table (src/tuner/sm1xx_tactics.cpp).
// Compiled, not run.
#include <vector>

#include "cuda/moe_gemm_sm1xx/sm120_nvfp4_bs_recipe.cuh"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_facts.cuh"

namespace fp4moe::cuda::sm1xx {

template <int M, int N, int K, int S = 0, bool F32 = false>
using R120 = Sm120Nvfp4GroupedRecipe<M, N, K, S, F32>;

const std::vector<BsKernelFacts>& sm120_bs_type_facts() {
  static const std::vector<BsKernelFacts> v = {
      // FlashInfer's SM120 grouped set (tile M 128, N 32 / 64 / 128, K 128 / 256), auto stages.
      facts_of<R120<128, 32, 128>>(), facts_of<R120<128, 64, 128>>(), facts_of<R120<128, 128, 128>>(),
      facts_of<R120<128, 32, 256>>(), facts_of<R120<128, 64, 256>>(), facts_of<R120<128, 128, 256>>(),
      // The wide tiles (CUTLASS 79d / TensorRT-LLM lists): auto, and each fixed stage count.
      facts_of<R120<128, 256, 128>>(), facts_of<R120<256, 128, 128>>(),
      facts_of<R120<128, 256, 128, 2>>(), facts_of<R120<128, 256, 128, 3>>(),
      facts_of<R120<256, 128, 128, 2>>(), facts_of<R120<256, 128, 128, 3>>(),
      facts_of<R120<128, 256, 256, 2>>(), facts_of<R120<256, 128, 256, 2>>(),
      // The same wide tiles beside an epilogue that also loads an FP32 C (bias / residual):
      // the case where 3 stages stop fitting (reconciles the seed's finding, tests pin it).
      facts_of<R120<128, 256, 128, 0, true>>(), facts_of<R120<128, 256, 128, 3, true>>(),
      facts_of<R120<256, 128, 128, 3, true>>(),
  };
  return v;
}

}  // namespace fp4moe::cuda::sm1xx
