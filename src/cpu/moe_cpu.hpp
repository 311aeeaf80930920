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

// The experts only, on a routing given by the caller (the multi-GPU paths: a rank computes
// the experts it holds; engine/dist/). Ids index w's experts; id -1 marks a slot to skip.
// The router weights, config top_k and groups are not used.
struct MoeExpertsArgs {
  const int32_t* topk_ids = nullptr;      // [T, top_k]
  const float* topk_weights = nullptr;    // [T, top_k]
  int64_t top_k = 0;
  bool shared = false;                    // add the shared expert (w must hold one)
};
// out [T, H] += Σ_j w_tj · expert_{id_tj}(x_t), accumulated as moe_forward_cpu does (one
// fused multiply-add per term, experts in ascending id, per expert its tokens ascending),
// then + shared(x_t) if asked. moe_forward_cpu is route_cpu followed by this.
void moe_experts_cpu(const MoeLayerWeights& w, const float* x, int64_t tokens, const MoeExpertsArgs& a, float* out,
                     const CpuMoeOptions& opt = {});
// slot_out[t·top_k + j, :] = expert_{id_tj}(x_t) [H], unweighted, for every slot with id >= 0
// (other rows untouched). An expert's output for a token equals the one moe_forward_cpu
// computes when the expert sees the same tokens in the same order (tiles of the CPU kernel)
// and T <= 1024 (its token chunk).
void moe_expert_slots_cpu(const MoeLayerWeights& w, const float* x, int64_t tokens, const int32_t* topk_ids,
                          int64_t top_k, float* slot_out, const CpuMoeOptions& opt = {});

}  // namespace fp4moe
