// route(): argument checks, the path choice by T and the workspace layout
// [counters: kRouterCounterSlots u32][split-K partials: splits x T x E f32].
#include <algorithm>

#include "core/error.hpp"
#include "cuda/routing/router_launch.hpp"

namespace fp4moe::cuda {
namespace {

constexpr size_t kCounterBytes = size_t(kRouterCounterSlots) * sizeof(unsigned);

size_t partial_bytes(int splits, int64_t tokens, int num_experts) {
  return splits > 1 ? size_t(splits) * size_t(tokens) * size_t(num_experts) * sizeof(float) : 0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

RouterPath router_auto_path(int tokens) {
  return tokens <= kRouterFusedMaxTokens ? RouterPath::FusedGemv : RouterPath::TiledGemm;
}

const char* router_path_name(RouterPath p) {
  switch (p) {
    case RouterPath::Auto: return "auto";
    case RouterPath::FusedGemv: return "fused_gemv";
    case RouterPath::TiledGemm: return "tiled_gemm";
  }
  return "?";
}

size_t router_workspace_bytes(int64_t max_tokens, int num_experts) {
  FP4MOE_CHECK(max_tokens >= 0 && max_tokens <= (int64_t(1) << 30) && num_experts >= 1,
               "router_workspace_bytes: bad max_tokens {} or experts {}", max_tokens, num_experts);
  size_t partials = 0;  // any path may be forced at any T: the max over T of the tiled partials
  for (int64_t t = 1; t <= max_tokens; ++t)
    partials = std::max(partials, partial_bytes(router_detail::tiled_max_splits(int(t), num_experts), t, num_experts));
  return kCounterBytes + partials;
}

void route(const RouterDesc& d, const uint16_t* x_bf16, const float* w, const float* bias, int tokens, int hidden,
           float* logits, int32_t* topk_ids, float* topk_weights, RouterWorkspace ws, cudaStream_t stream,
           RouterPath path) {
  check_router_desc(d);
  FP4MOE_CHECK(tokens >= 0, "route: {} tokens", tokens);
  if (tokens == 0) return;
  FP4MOE_CHECK(hidden >= 8 && hidden % 8 == 0, "route: hidden size {} must be a positive multiple of 8", hidden);
  FP4MOE_CHECK(x_bf16 && w && logits && topk_ids && topk_weights && ws.ptr,
               "route: null input, weight, output or workspace pointer");
  FP4MOE_CHECK(aligned16(x_bf16) && aligned16(w) && aligned16(ws.ptr),
               "route: x, the router weight and the workspace must be 16-byte aligned");
  if (path == RouterPath::Auto) path = router_auto_path(tokens);
  unsigned* counters = static_cast<unsigned*>(ws.ptr);
  if (path == RouterPath::FusedGemv) {
    FP4MOE_CHECK(router_detail::fused_token_blocks(tokens) <= kRouterCounterSlots,
                 "route: {} tokens are too many for the fused GEMV path", tokens);
    FP4MOE_CHECK(ws.bytes >= kCounterBytes, "route: workspace of {} B, needs {} B", ws.bytes, kCounterBytes);
    router_detail::launch_fused_gemv(d, x_bf16, w, bias, tokens, hidden, logits, topk_ids, topk_weights, counters,
                                     stream);
    return;
  }
  const router_detail::TiledPlan p = router_detail::tiled_plan(tokens, d.num_experts, hidden);
  const size_t need = kCounterBytes + partial_bytes(p.splits, tokens, d.num_experts);
  FP4MOE_CHECK(ws.bytes >= need, "route: workspace of {} B, {} tokens need {} B (router_workspace_bytes)", ws.bytes,
               tokens, need);
  float* partials = p.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + kCounterBytes) : nullptr;
  router_detail::launch_tiled_gemm(p, x_bf16, w, tokens, d.num_experts, hidden, partials ? partials : logits, stream);
  router_detail::launch_select(d, partials, p.splits, tokens, bias, logits, topk_ids, topk_weights, stream);
}

}  // namespace fp4moe::cuda
