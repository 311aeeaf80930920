// Internal to cuda/routing: the launchers behind route() (router_route.cu), one per kernel
// file. Callers have validated the arguments (route()).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/routing/router.hpp"

namespace fp4moe::cuda::router_detail {

// router_fused_gemv_bf16_f32.cu: logits + selection in one launch. counters: >= the number of
// token blocks (<= kRouterCounterSlots), all 0 on entry and on exit.
int fused_token_blocks(int tokens);
void launch_fused_gemv(const RouterDesc& d, const uint16_t* x, const float* w, const float* bias, int tokens,
                       int hidden, float* logits, int32_t* ids, float* wts, unsigned* counters, cudaStream_t st);

// router_tiled_gemm_bf16_f32.cu: out [splits, T, E] (partial) logits, then the selection.
struct TiledPlan {
  int tm = 8;        // tokens per thread: the CTA tile is (16 tm tokens) x 128 experts
  int splits = 1;    // split-K factor (1: the GEMM writes the logits themselves)
  int k_chunk = 0;   // reduction elements per split (multiple of 8)
};
// splits before clamping by hidden (an upper bound of the real one: sizes the workspace).
int tiled_max_splits(int tokens, int num_experts);
TiledPlan tiled_plan(int tokens, int num_experts, int hidden);
void launch_tiled_gemm(const TiledPlan& p, const uint16_t* x, const float* w, int tokens, int num_experts,
                       int hidden, float* out, cudaStream_t st);
// partials [splits, T, E] (splits > 1) or nullptr (the logits are already final).
void launch_select(const RouterDesc& d, const float* partials, int splits, int tokens, const float* bias,
                   float* logits, int32_t* ids, float* wts, cudaStream_t st);

}  // namespace fp4moe::cuda::router_detail
