// What a recipe's CUTLASS types say about themselves, read off the types (no kernel body is
// instantiated by this): the shared storage the launch will ask for, the stage count the
// builder resolved, and the pieces of the shared storage. Used by the facts translation units
// (every listed config) and by each kernel instantiation (its own facts).
#pragma once

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::cuda::sm1xx {

template <class R>
BsKernelFacts facts_of() {
  BsKernelFacts f;
  f.recipe = R::kRecipe;
  f.tile_m = R::kM;
  f.tile_n = R::kN;
  f.tile_k = R::kK;
  f.stages = R::Mainloop::DispatchPolicy::Stages;
  f.auto_stages = R::kAutoStages;
  f.f32_source = R::kSource;
  f.smem_bytes = int64_t(sizeof(typename R::Kernel::SharedStorage));
  f.mainloop_bytes = int64_t(sizeof(typename R::Mainloop::TensorStorage));
  f.epilogue_bytes = int64_t(sizeof(typename R::Epilogue::TensorStorage));
  f.epilogue_carveout = int64_t(sizeof(typename R::Epilogue::SharedStorage));
  f.builder_capacity = R::kBuilderCapacity;
  f.threads = int(R::Kernel::MaxThreadsPerBlock);
  return f;
}

}  // namespace fp4moe::cuda::sm1xx
