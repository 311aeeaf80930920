// MoE router on the GPU: logits = x · W_gateᵀ in FP32, then ONE fused kernel for
// scoring (sigmoid or softmax), biased selection (grouped top-k, then top-k) and the
// weights (unbiased scores, normalised, times routed_scaling).
//
// Tie rule (identical to cpu/moe_cpu.hpp route_cpu): experts are ranked by their
// biased score, higher first; equal scores -> the lower expert id first. Groups are
// ranked by group score the same way (equal -> the lower group id). The k slots of a
// token are written in rank order.
//
// No host synchronisation anywhere: every function only enqueues on `stream`, so the
// router can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "format/moe_layer.hpp"

namespace fp4moe::cuda {

// What the fused selection kernel computes (a subset of MoeConfig, as ints).
struct RouterDesc {
  int num_experts = 0;    // E (<= kMaxRouterExperts)
  int top_k = 0;          // k (<= kMaxRouterTopK)
  int n_group = 1;        // grouped top-k; 1 = no grouping
  int topk_group = 1;
  ScoringFunc scoring = ScoringFunc::Sigmoid;
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f;
};
inline constexpr int kMaxRouterExperts = 1024;
inline constexpr int kMaxRouterTopK = 32;
inline constexpr int kMaxRouterGroups = 64;

RouterDesc router_desc_from(const MoeConfig& cfg);
// Throws fp4moe::Error with the reason when the kernel cannot run this config.
void check_router_desc(const RouterDesc& d);

// The previous three-step path's first two steps (router.cu; the router benchmark's baseline):
// out[i] = float(in[i]) for n bf16 values.
void bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);

// logits [T, E] f32 = x [T, H] f32 · w [E, H]ᵀ f32 (cuBLAS SGEMM, FP32 math; the
// handle's stream is set to `stream`). tokens may be 0 (nothing is launched). Not on the
// layer's path: route() computes the logits itself.
void router_logits_f32(cublasHandle_t handle, const float* x, const float* w, float* logits,
                       int tokens, int hidden, int num_experts, cudaStream_t stream);

// ---- The router (use this): BF16 x in, FP32 logits + top-k out -----------------------------
//
// route() reads x as BF16 (exact in FP32), computes logits = x · wᵀ with FP32 FMAs into
// `logits` [T, E] (always written), then the selection (the tie rule above) into
// topk_ids [T, k] / topk_weights [T, k]. Two paths, chosen by T on the host (no sync):
//   FusedGemv (T <= kRouterFusedMaxTokens): ONE launch; CTAs own a few experts and a small
//     token block, stream their W rows once, and the last CTA to finish a token block (a
//     device counter, reset to 0 by that CTA) runs the selection of those tokens.
//   TiledGemm (larger T): a 2-D tiled SIMT FP32 GEMM (split-K into workspace partials
//     where the tile grid alone cannot fill the GPU), then one selection kernel that sums
//     the partials in a fixed order, writes the logits and selects.
// Deterministic: a token's logits do not depend on how often or in which graph it runs.
// Requirements: hidden % 8 == 0, x and w 16-byte aligned, ws.bytes >= router_workspace_bytes(T, E).
// The workspace must be zeroed ONCE after allocation (route() leaves its counters at 0), and
// must not be shared by two routers running concurrently on different streams.
enum class RouterPath : uint8_t { Auto, FusedGemv, TiledGemm };
inline constexpr int kRouterFusedMaxTokens = 32;
// Above this many token blocks the fused path is refused (its counter slots); T <= 8192.
inline constexpr int kRouterCounterSlots = 1024;

struct RouterWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Device bytes route() needs for any T <= max_tokens (counters + split-K partials).
size_t router_workspace_bytes(int64_t max_tokens, int num_experts);
// The path RouterPath::Auto takes for this many tokens.
RouterPath router_auto_path(int tokens);
const char* router_path_name(RouterPath p);

void route(const RouterDesc& d, const uint16_t* x_bf16, const float* w, const float* bias, int tokens,
           int hidden, float* logits, int32_t* topk_ids, float* topk_weights, RouterWorkspace ws,
           cudaStream_t stream, RouterPath path = RouterPath::Auto);

// ---- The previous three-step path (kept for the benchmark and tests) ------------------------

// logits [T, E] f32, bias [E] f32 or null -> topk_ids [T, k] i32, topk_weights [T, k] f32.
void route_topk(const RouterDesc& d, const float* logits, const float* bias, int tokens,
                int32_t* topk_ids, float* topk_weights, cudaStream_t stream);

}  // namespace fp4moe::cuda
