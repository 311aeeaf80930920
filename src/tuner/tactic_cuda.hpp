// Conversions between the tuner's CUDA-free mirrors and the kernels' types
// (src/cuda/moe_gemm/moe_gemm.hpp). CUDA builds only.
#pragma once

#ifdef FP4MOE_HAVE_CUDA

#include "cuda/moe_gemm/moe_gemm.hpp"
#include "tuner/tactic.hpp"

namespace fp4moe::tuner {

GemmProblem from_cuda_desc(const cuda::MoeGemmDesc& d, int top_k = 8);
cuda::MoeGemmDesc to_cuda_desc(const GemmProblem& p, int max_tokens);
// Impl -> GemmKernel; throws for the listed-only Blackwell tactics (no GemmKernel exists).
cuda::TileConfig to_cuda_config(const Tactic& t);
Tactic from_cuda_config(const cuda::TileConfig& c);

// The MoE layer's lookup: the tuned config for this desc at `tokens` total tokens (nearest
// tuned bucket of this GPU's plan cache, re-validated), else the fallback (Generic).
cuda::TileConfig plan_for(const cuda::MoeGemmDesc& d, int64_t tokens, int top_k = 8);

}  // namespace fp4moe::tuner

#endif
