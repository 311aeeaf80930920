// The full configuration of an MLA model of the GLM-5 / DeepSeek-V3 family, as the forward
// pass needs it, parsed from config.json the way transformers 5.x reads it:
//   GlmMoeDsaForCausalLM (GLM-5, 5.1, 5.2), DeepseekV3ForCausalLM, DeepseekV32ForCausalLM.
//
// RoPE (transformers' RotaryEmbeddingConfigMixin): rope_parameters (transformers 5), or the
// older rope_scaling (+ rope_theta at the top level); rope_type "default" or "yarn" (with
// factor, beta_fast/slow, mscale, mscale_all_dim, original_max_position_embeddings,
// attention_factor, truncate). The rotated dim is qk_rope_head_dim. YaRN multiplies cos/sin
// by the attention factor and the softmax scale by mscale(factor, mscale_all_dim)².
// Interleaved pairs (x0,x1),(x2,x3).. for MLA (DeepSeek-V3: unless rope_interleave is false)
// and for GLM-5's indexer; DeepSeek-V3.2's indexer rotates halves (x_i, x_{i+d/2}).
//
// Indexer layers: indexer_types, else index_topk_pattern ("F"/"S" string or list), else
// layer i is "full" iff max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0
// (defaults 2 and 1: every layer full). DeepSeek-V3.2: every layer full. DeepSeek-V3: none.
// MLP layers: mlp_layer_types, else the first first_k_dense_replace layers dense.
// Anything the forward pass does not implement is rejected with one line naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "format/checkpoint.hpp"

namespace fp4moe::model {

enum class Family : uint8_t { GlmMoeDsa, DeepseekV3, DeepseekV32 };
enum class RopeLayout : uint8_t { Interleaved, HalfSplit };
enum class IndexerKind : uint8_t { None, Full, Shared };

struct RopeSpec {
  std::string type = "default";  // "default" | "yarn"
  double theta = 10000.0;
  int64_t dim = 0;               // rotated dims per head (qk_rope_head_dim), even
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 0.0, mscale_all_dim = 0.0;
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;
  float attention_factor = 1.0f;  // multiplies cos and sin
  std::vector<float> inv_freq;    // [dim / 2], FP32 as transformers computes it
};

struct MlaModelConfig {
  std::string architecture;
  Family family = Family::GlmMoeDsa;
  int64_t vocab = 0, hidden = 0, num_layers = 0, intermediate = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA (q_proj), DeepSeek-V3 with q_lora_rank null
  int64_t kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  double rms_norm_eps = 1e-6;  // block norms; q_a / kv_a norms use 1e-6, the indexer's LayerNorm 1e-6
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  RopeSpec rope;
  RopeLayout mla_rope = RopeLayout::Interleaved;
  RopeLayout index_rope = RopeLayout::Interleaved;
  float softmax_scale = 0.0f;  // (nope + rope)^-½, × mscale² for YaRN

  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  std::vector<IndexerKind> indexer;  // [num_layers]
  std::vector<bool> moe_layer;       // [num_layers]
  MoeConfig moe;
  std::string topk_method;
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored as model.layers.{num_layers + i}

  int64_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  bool has_indexer() const { return index_n_heads > 0; }
};

// Upper bounds of the sizes the engine derives from a config, computed in double (no
// overflow whatever the fields): the checkpoint's parameters, the FP32 KV cache of one
// position over all layers, and the FP32 scratch one token of a step can take (activations,
// indexer scores over max_position_embeddings, index_topk ids, a logits row).
struct MlaSizes {
  double weight_params = 0, kv_bytes_per_token = 0, scratch_bytes_per_token = 0;
};
MlaSizes mla_sizes(const MlaModelConfig& c);
// The ceilings parse_mla_model_config holds them to (the largest supported model, GLM-5:
// ~7.5e11 parameters, ~220 KB of KV and ~60 MB of scratch per token).
constexpr double kMaxWeightParams = double(int64_t(1) << 42);      // ~4.4e12
constexpr double kMaxKvBytesPerToken = double(int64_t(16) << 20);  // 16 MiB
constexpr double kMaxScratchBytesPerToken = double(int64_t(256) << 20);  // 256 MiB
constexpr int64_t kMaxNextnLayers = 16;

// `base` is the checkpoint's already-parsed ModelConfig (routing fields, layer counts, each
// field range-checked). Every value the forward pass reads is checked here: one line names
// the key and the allowed range; the sizes above are held to their ceilings.
MlaModelConfig parse_mla_model_config(const nlohmann::json& j, const ModelConfig& base, const std::string& path);

// cos/sin of position `pos`: cos_sin[i] = {cos, sin}(inv_freq[i] · pos) · attention_factor,
// angle computed in FP32 as transformers does.
void rope_cos_sin(const RopeSpec& r, int64_t pos, float* cos, float* sin);
// Rotates x[0..dim) in place: Interleaved pairs (2i, 2i+1) or HalfSplit pairs (i, i + dim/2)
// by frequency i. (transformers writes the interleaved result de-interleaved; dot products
// between two rotated vectors are the same either way, and this keeps DeepSeek's order.)
void apply_rope(float* x, int64_t dim, const float* cos, const float* sin, RopeLayout layout);

}  // namespace fp4moe::model
