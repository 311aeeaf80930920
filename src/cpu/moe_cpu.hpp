// The CPU MoE layer: the reference every GPU kernel is tested against, and the
// embedded default backend. Multi-threaded; FP4 weights are decoded on the fly.
#pragma once

#include <cstdint>
#include <vector>

#include "format/moe_layer.hpp"

namespace fp4moe {

struct RoutingResult {
  int64_t tokens = 0, top_k = 0;
  std::vector<int32_t> topk_ids;     // [T, k], ordered by descending selection score;
                                     // ties broken by the lower expert id
  std::vector<float> topk_weights;   // [T, k], after normalisation and routed scaling
};

struct MoeOutput {
  RoutingResult routing;
  std::vector<float> logits;  // [T, E] F32: the router logits the routing was computed from
  std::vector<float> out;     // [T, H] F32
};

struct CpuMoeOptions {
  int threads = 0;                  // 0: default_num_threads()
  bool bf16_activations = true;     // round x and SiLU(g)·u to BF16 before each GEMM, as the GPU does
  // [T, E] router logits to route on instead of computing them from x (tests: the CPU selection
  // and experts on the GPU's own logits, so that both backends pick the same experts).
  const float* router_logits = nullptr;
};

// logits: [T, E] FP32 router logits. Sigmoid or softmax scores; the correction bias is
// added for selection only; grouped top-k (n_group / topk_group; a group's score is the
// sum of its best two biased scores, as DeepSeek-V3 / GLM-5 do); then top-k.
RoutingResult route_cpu(const MoeConfig& cfg, const float* logits, const float* bias, int64_t tokens);

// Full layer: router -> experts (gate_up, SiLU·up, down) -> weighted combine (+ shared expert).
MoeOutput moe_forward_cpu(const MoeLayerWeights& w, const float* x, int64_t tokens,
                          const CpuMoeOptions& opt = {});

}  // namespace fp4moe
