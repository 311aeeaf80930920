// Random MoE layers in memory (benchmarks, tests): valid FP4 experts (random E2M1 codes,
// random E4M3/E8M0 block scales in a narrow range, a global scale giving weights of
// magnitude ~1/sqrt(K)), random FP32 router weights and a small correction bias.
// Multi-threaded and deterministic for a seed; full GLM-5 size (~5.5 GB) in seconds.
#pragma once

#include <cstdint>

#include "format/moe_layer.hpp"

namespace fp4moe::moe {

// GLM-5's MoE layer: H 6144, I 2048, 256 experts, top-8, sigmoid + bias, n_group 1,
// routed scaling 2.5, norm_topk_prob, one shared expert of 2048.
MoeConfig glm5_moe_config();

MoeLayerWeights random_moe_layer(const MoeConfig& cfg, uint64_t seed, WeightFormat format = WeightFormat::NVFP4);

// The layer's FP4 shared expert dequantized to BF16 in place (the values are exact in BF16 up
// to the global scale's rounding), as NVIDIA's NVFP4 checkpoints store it. No-op without one.
void shared_expert_to_bf16(MoeLayerWeights& w);

}  // namespace fp4moe::moe
