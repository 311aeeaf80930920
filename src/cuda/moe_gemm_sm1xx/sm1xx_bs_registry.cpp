// The Blackwell NVFP4 grouped GEMMs compiled into this binary (by arch built) and the CUTLASS
// type facts of every listed config. Compiled, not run.
#include <fmt/format.h>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::cuda::sm1xx {

#ifdef FP4MOE_HAVE_SM120
const std::vector<BsKernelFacts>& sm120_bs_type_facts();
const BsKernel& sm120_nvfp4_grouped_128x32x256();
const BsKernel& sm120_nvfp4_grouped_128x64x128();
const BsKernel& sm120_nvfp4_grouped_128x128x128();
#endif
#ifdef FP4MOE_HAVE_SM100
const std::vector<BsKernelFacts>& sm100_bs_type_facts();
const BsKernel& sm100_nvfp4_grouped_1sm_128x64x256();
const BsKernel& sm100_nvfp4_grouped_2sm_256x128x256();
const BsKernel& sm100_nvfp4_moe_decode_128x64x256();
#endif

std::string_view recipe_name(BsRecipe r) {
  switch (r) {
    case BsRecipe::Sm120Grouped: return "sm120-bs";
    case BsRecipe::Sm100Grouped1Sm: return "sm100-bs-1sm";
    case BsRecipe::Sm100Grouped2Sm: return "sm100-bs-2sm";
    case BsRecipe::Sm100MoeDecode: return "sm100-bs-moe";
  }
  return "?";
}

int recipe_cc(BsRecipe r) { return r == BsRecipe::Sm120Grouped ? 120 : 100; }

std::string BsKernelFacts::name() const {
  return fmt::format("{} {}x{}x{} s{}{}{}", recipe_name(recipe), tile_m, tile_n, tile_k, stages,
                     auto_stages ? " auto" : "", f32_source ? " f32-source" : "");
}

std::span<const BsKernelFacts> bs_type_facts() {
  static const std::vector<BsKernelFacts> all = [] {
    std::vector<BsKernelFacts> v;
#ifdef FP4MOE_HAVE_SM120
    for (const BsKernelFacts& f : sm120_bs_type_facts()) v.push_back(f);
#endif
#ifdef FP4MOE_HAVE_SM100
    for (const BsKernelFacts& f : sm100_bs_type_facts()) v.push_back(f);
#endif
    return v;
  }();
  return all;
}

std::span<const BsKernel> bs_kernels() {
  static const std::vector<BsKernel> all = [] {
    std::vector<BsKernel> v;
#ifdef FP4MOE_HAVE_SM120
    v.push_back(sm120_nvfp4_grouped_128x32x256());
    v.push_back(sm120_nvfp4_grouped_128x64x128());
    v.push_back(sm120_nvfp4_grouped_128x128x128());
#endif
#ifdef FP4MOE_HAVE_SM100
    v.push_back(sm100_nvfp4_grouped_1sm_128x64x256());
    v.push_back(sm100_nvfp4_grouped_2sm_256x128x256());
    v.push_back(sm100_nvfp4_moe_decode_128x64x256());
#endif
    return v;
  }();
  return all;
}

}  // namespace fp4moe::cuda::sm1xx
