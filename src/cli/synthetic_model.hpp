// Random models for `fp4moe make-synthetic`: presets, their config.json, and the plan of
// every tensor (names as in GLM-5 / DeepSeek-V3 checkpoints, NVIDIA's NVFP4 layout).
//
// Layout: the routed experts of the decoder layers are NVFP4 (ModelOpt: weight U8 [N, K/2],
// weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 [] shared by gate and up of an expert,
// input_scale F32 []); everything else is BF16 (attention, indexer, dense MLPs, the shared
// expert, the router, embeddings, lm_head, norms, the MTP layer(s)) except the router's
// e_score_correction_bias (F32). MTP layer i sits at model.layers.{num_hidden_layers + i}: a
// whole decoder layer (MoE, BF16 experts) plus enorm, hnorm, eh_proj [H, 2H], shared_head.norm
// (DeepSeek-V3 also carries embed_tokens and shared_head.head there; GLM-5 does not).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"

namespace fp4moe::cli {

struct SyntheticSpec {
  std::string preset;
  std::string architecture;  // "GlmMoeDsaForCausalLM" | "DeepseekV3ForCausalLM"
  int64_t vocab = 0, hidden = 0, inter_dense = 0, moe_inter = 0;
  int64_t experts = 0, top_k = 0, n_group = 1, topk_group = 1, n_shared = 1;
  int64_t layers = 0, dense_layers = 0, mtp_layers = 0;
  int64_t heads = 0, q_lora = 0 /* 0: q_proj, config null */, kv_lora = 0, nope_dim = 0, rope_dim = 0, v_dim = 0;
  int64_t index_heads = 0 /* 0: no DSA indexer */, index_dim = 0, index_topk = 0;
  std::vector<std::string> indexer_types;  // per decoder layer: "full" | "shared"
  nlohmann::json rope_parameters;
  double rms_norm_eps = 1e-5;
  int64_t max_positions = 0;
  bool sharded = false;  // one shard per layer + index (glm5-layer)

  bool is_glm() const { return architecture == "GlmMoeDsaForCausalLM"; }
  bool has_indexer(int64_t layer) const;  // MTP layers: yes when the model has an indexer
};

// Presets: glm5-tiny, glm5-tiny-shared, deepseek-v3-tiny, glm5-attn-tiny, deepseek-v3-attn-tiny,
// glm5-layer. The optional counts
// override the preset's decoder layers, dense layers and MTP layers.
SyntheticSpec synthetic_preset(const std::string& name, std::optional<int64_t> layers,
                               std::optional<int64_t> dense_layers, std::optional<int64_t> mtp_layers);
const std::vector<std::string>& synthetic_preset_names();

// config.json (transformers 5.x field names, plus quantization_config) and the ModelOpt
// exclude_modules globs.
nlohmann::json synthetic_config(const SyntheticSpec& s);
std::vector<std::string> synthetic_exclude_modules(const SyntheticSpec& s);

// One planned entry. Bf16 / F32: one random tensor [rows, cols] (cols 0: 1-D [rows]) ~
// mean + std * N(0, 1). Nvfp4GateUp: `name` is an expert prefix; writes its gate_proj and
// up_proj [rows, cols] with one shared weight_scale_2. Nvfp4Linear: `name` is a module.
struct SyntheticTensor {
  enum class Kind : uint8_t { Bf16, F32, Nvfp4GateUp, Nvfp4Linear };
  std::string name;
  Kind kind = Kind::Bf16;
  int64_t rows = 0, cols = 0;
  float std_dev = 0, mean = 0;
};

struct SyntheticShard {
  std::string file;
  std::vector<SyntheticTensor> tensors;
};

// Every tensor of the model, by shard (one file for the tiny presets).
std::vector<SyntheticShard> synthetic_plan(const SyntheticSpec& s);

// The tensors an entry writes: name, dtype, shape.
struct WrittenTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
std::vector<WrittenTensor> written_tensors(const SyntheticTensor& t);

}  // namespace fp4moe::cli
