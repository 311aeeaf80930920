// Weight binding: every tensor of an MLA checkpoint (GLM-5 / DeepSeek-V3 family) bound by its
// checkpoint name to a view into the mmap'd shards (no second host copy; only norms, the
// router (FP32) and small vectors are copied). A missing tensor, a wrong shape or dtype, or a
// tensor the model does not use is an error naming it.
//
// Linear layers may each be NVFP4 (ModelOpt or compressed-tensors), MXFP4, BF16 or F32:
//   - NVIDIA's NVFP4 checkpoints: routed experts NVFP4 with input_scale (W4A4), everything
//     else BF16, the shared expert included;
//   - `fp4moe quantize` output: every linear NVFP4 (or MXFP4) except embeddings, lm_head,
//     norms and the router;
//   - all-BF16 (or F32) checkpoints as transformers saves them.
// The MTP layers (model.layers.{num_hidden_layers + i}.*, num_nextn_predict_layers of them)
// are bound apart when present and never taken for decoder layers.
//
// Tensors read but not used by the forward pass: "*.k_scale", "*.v_scale" (ModelOpt KV-cache
// calibration) and "*.rotary_emb.inv_freq" are accepted and ignored.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/linear_cpu.hpp"
#include "format/checkpoint.hpp"
#include "model/model_config.hpp"

namespace fp4moe::model {

struct NormWeights {
  std::vector<float> weight;  // [dim]
  std::vector<float> bias;    // [dim] (LayerNorm) or empty (RMSNorm)
};

struct Linear {
  cpu::LinearView w;
  float input_scale = 0.0f;  // NVFP4 W4A4 activation scale, 0 if absent
};

struct IndexerWeights {
  Linear wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  Linear wk;            // [index_head_dim, hidden]
  NormWeights k_norm;   // LayerNorm with bias, eps 1e-6
  Linear weights_proj;  // [index_n_heads, hidden]
};

struct AttentionWeights {
  Linear q_proj;            // [H * qk_head, hidden] when q_lora_rank == 0
  Linear q_a;               // [q_lora_rank, hidden]
  NormWeights q_a_norm;     // RMSNorm eps 1e-6
  Linear q_b;               // [H * qk_head, q_lora_rank]
  Linear kv_a;              // [kv_lora_rank + qk_rope, hidden]
  NormWeights kv_a_norm;    // RMSNorm eps 1e-6
  Linear kv_b;              // [H * (qk_nope + v_head), kv_lora_rank]: per head nope rows, then v rows
  Linear o;                 // [hidden, H * v_head]
  std::optional<IndexerWeights> indexer;  // layers whose indexer type is "full"
};

struct DenseMlpWeights {
  Linear gate, up, down;
};

struct LayerWeights {
  NormWeights input_norm, post_attention_norm;
  AttentionWeights attn;
  bool is_moe = false;
  DenseMlpWeights mlp;   // dense layers
  MoeLayerWeights moe;   // MoE layers: expert stacks in view mode
};

struct MtpWeights {
  NormWeights enorm, hnorm, shared_head_norm;
  Linear eh_proj;                   // [hidden, 2 * hidden]
  std::optional<Linear> embed;      // own embedding (else the model's)
  std::optional<Linear> head;       // own lm_head (else the model's)
  LayerWeights layer;               // the decoder block (attention + MoE)
};

struct ModelWeights {
  Linear embed;                     // [vocab, hidden] BF16/F32 (rows are looked up)
  std::vector<LayerWeights> layers;
  NormWeights final_norm;
  Linear lm_head;                   // [vocab, hidden]; the embedding when tied
  std::vector<MtpWeights> mtp;
  std::string summary;              // one line: formats by role, MTP, bytes
};

// check_only: every check of the binding (names, shapes, dtypes, formats, unused tensors) on
// the headers only, no tensor data read (`fp4moe inspect`): norms, biases and the router are
// not copied nor checked for finiteness, and the weights returned are views not to be used.
ModelWeights bind_weights(const Checkpoint& ck, const MlaModelConfig& c, bool check_only = false);

// The MTP layers' routed experts that the checkpoint stores in BF16 (NVIDIA's NVFP4 checkpoints
// keep the MTP layer unquantized: 256 BF16 experts, ~19 GB for GLM-5) quantized to NVFP4
// (cpu::quantize_experts_nvfp4: the FP4 grouped GEMM's format, one global per expert), owned by
// w from then on; FP4 experts and dense MTP layers are left alone. Drafts only: verification
// uses the target, so the output does not change (speculation's acceptance may). Returns the
// number of experts quantized (0 when none was BF16).
int64_t quantize_mtp_experts(ModelWeights& w, int threads);

}  // namespace fp4moe::model
