// The layer stack of the GLM-5 / DeepSeek-V3 / V3.2 family, written once against model/ops.hpp:
// every backend runs these functions with its own op set (Model::step with the CPU op set,
// GpuRunner's forward with the CUDA op set, eager or captured in a graph).
//
//   x = embed(tokens)
//   per layer l: x += attention_l(RMSNorm_in(x)); x += FFN_l(RMSNorm_post(x))   (FFN: dense MLP or MoE)
//   h = RMSNorm_final(x); logits = lm_head(h[rows])
//
// The MTP layer (model.layers.{num_layers}): x = eh_proj([enorm(embed(t)) | hnorm(h_in)]), the same
// decoder block, shared_head.norm, the MTP head (its own, else lm_head).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.hpp"
#include "model/model_config.hpp"
#include "model/ops.hpp"

namespace fp4moe::model {

// Per-layer hidden states of a step (transformers' output_hidden_states layout): [0] the
// embeddings, [i] the output of layer i-1 for 1 <= i < L, [L] after the final norm; FP32 [T, hidden].
using HiddenStates = std::vector<std::vector<float>>;

// The views one forward runs over (all from the caller's workspace, on the op set's device).
struct ForwardViews {
  TensorView tokens;              // I32 [T]
  TensorView x, h, o;             // [T, hidden]: the residual, the normed input, a block's output
  TensorView rows, logits;        // I32 [n], F32 [n, vocab]; n = 0: no head
  HiddenStates* hidden = nullptr;  // filled when set
  float* final_hidden = nullptr;   // host [T, hidden]: every token's state after the final norm, when set
};

// One decoder block in place on the residual x (h, o: scratch of the same shape).
void decoder_block(Ops& ops, LayerRef ref, IndexerKind indexer, bool moe, const TensorView& x, const TensorView& h,
                   const TensorView& o);

// The target model's forward over a step.
void forward(Ops& ops, const MlaModelConfig& c, const ForwardViews& v);

// The MTP layer over a step: tokens[t] the token after position p, h_in [T, hidden] the target's
// post-final-norm state at p; eg [T, 2·hidden] and e [T, hidden] scratch; h_out (host) when set.
struct MtpViews {
  TensorView tokens, h_in, eg, e, x, h, o, rows, logits;
  float* h_out = nullptr;
};
void mtp_forward(Ops& ops, const MlaModelConfig& c, IndexerKind indexer, bool moe, const MtpViews& v);

}  // namespace fp4moe::model
