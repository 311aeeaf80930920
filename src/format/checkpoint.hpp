// Hugging Face checkpoint folders: config.json, model.safetensors (or an index + shards),
// the quantization config, and the tensor groups of every linear layer by format.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "format/moe_layer.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {

// The fields of config.json the engine uses (GLM-5 / DeepSeek-V3 / GLM-4.5 / Qwen3-MoE).
struct ModelConfig {
  std::string architecture;   // architectures[0], e.g. "GlmMoeDsaForCausalLM"
  std::string model_type;
  int64_t hidden_size = 0, num_layers = 0, vocab_size = 0, intermediate_size = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int64_t first_k_dense_replace = 0;   // layers [0, this) are dense MLP
  int64_t moe_layer_freq = 1;
  MoeConfig moe;                       // hidden/inter/experts/top-k/groups/scoring/shared
  // MLA (DeepSeek-V3 / GLM-5); 0 when absent
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // sparse-attention indexer (GLM-5 DSA); 0 when absent
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;
  // routing details as config.json names them
  std::string topk_method;             // "noaux_tc" (GLM-5 / DeepSeek-V3), "greedy", ... ("" if absent)
  std::string hidden_act = "silu";
  int64_t n_shared_experts = 0;        // DeepSeek / GLM naming; Qwen: 1 when shared_expert_intermediate_size > 0
  // Qwen3-MoE layer pattern: layer is MoE iff not in mlp_only_layers and (layer+1) % step == 0
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::vector<bool> moe_layers;        // [num_layers], filled by parse_model_config

  bool is_moe_layer(int64_t layer) const;
  int64_t num_moe_layers() const;
};
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& path_for_errors);

enum class TensorGroupFormat : uint8_t { ModelOptNVFP4, CompressedNVFP4, MXFP4, BF16, F32, Other };
std::string_view tensor_group_format_name(TensorGroupFormat f);

// One linear layer's tensors, e.g. prefix "model.layers.3.mlp.experts.7.gate_proj".
struct TensorGroup {
  std::string prefix;
  TensorGroupFormat format = TensorGroupFormat::Other;
  std::map<std::string, const TensorInfo*> parts;  // "weight", "weight_scale", ...
  const SafetensorsFile* file = nullptr;            // all parts live in one shard
  std::vector<std::string> problems;               // malformed parts found by groups(), one line each
  int64_t bytes() const;                           // sum of the parts' sizes
};

struct QuantConfig {
  std::string quant_method;  // "modelopt", "compressed-tensors", "mxfp4", "" (none)
  std::string quant_algo;    // "NVFP4", "W4A16_NVFP4", "MXFP4", ...
  int group_size = 0;
  std::vector<std::string> ignore;  // module globs left unquantized (ignore / exclude_modules)
  bool is_ignored(std::string_view module) const;  // module_glob_match over `ignore` (may throw, see there)
  std::string format;        // compressed-tensors format, e.g. "nvfp4-pack-quantized"
  bool activation_quant = false;  // activations quantized too (NVFP4 W4A4), not weight-only
  // The KV cache the checkpoint declares: ModelOpt's kv_cache_quant_algo ("FP8"), compressed-
  // tensors' kv_cache_scheme (8-bit float: "FP8", else "<type><bits>"); "" when none.
  std::string kv_cache_quant_algo;
  std::string source;        // file the quant config came from ("" if none)
};
// Parses hf_quant_config.json (ModelOpt: {"quantization": {...}}) or config.json's
// "quantization_config" (ModelOpt, compressed-tensors, mxfp4). Unknown methods throw.
QuantConfig parse_quant_config(const nlohmann::json& j, const std::string& path_for_errors);
// fnmatch-style match of the whole name: '*' any run, '?' one char, "re:<regex>" (as
// compressed-tensors writes) a regex matched from the start (PCRE2, Python's re.match). The one
// matcher of every command (quant_config.cpp): a regex that needs more than a bounded number of
// backtracking steps throws an Error naming the pattern instead of running on.
bool module_glob_match(std::string_view pattern, std::string_view name);

// One linear layer's tensors as found in the files ("<prefix>.weight", ...), checked against
// [n, k] (see checkpoint.cpp for the layouts). Views stay valid while the Checkpoint lives.
struct LinearTensors {
  std::string prefix;
  TensorGroupFormat format = TensorGroupFormat::Other;
  const TensorInfo* weight = nullptr;  // packed (FP4) or dense (BF16/F32)
  const TensorInfo* scales = nullptr;  // FP4 block scales
  const SafetensorsFile* wfile = nullptr;
  const SafetensorsFile* sfile = nullptr;
  float global = 1.0f;                 // NVFP4 weight_scale_2 (compressed: 1 / weight_global_scale)
  float input_scale = 0.0f;            // NVFP4 W4A4 activation scale (input_scale; compressed: 1 / input_global_scale); 0 if absent
  std::vector<std::string> names;      // every tensor of the group that was read or checked
};

class Checkpoint {
 public:
  // Reads and validates the folder; errors name the file and the problem.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const nlohmann::json& config_json() const;
  const QuantConfig& quant() const { return quant_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const TensorInfo* find(std::string_view name, const SafetensorsFile** file = nullptr) const;
  std::vector<TensorGroup> groups() const;  // every linear layer, by prefix
  // Finds and validates one linear layer of n rows (outputs) and k columns (reduction dim).
  LinearTensors find_linear(const std::string& prefix, int64_t n, int64_t k) const;

  // Stacks layer `layer`'s routed experts ([E, 2I, H] w13 with gate rows first, [E, H, I] w2),
  // router, correction bias and shared expert. Checks shapes, dtypes and finiteness.
  // Gate and up of one expert must share one global scale: if a checkpoint gives two,
  // the block scales of the smaller are rescaled to the larger (as vLLM does), logged.
  MoeLayerWeights load_moe_layer(int64_t layer) const;

  ~Checkpoint();

 private:
  Checkpoint() = default;
  std::string dir_;
  ModelConfig config_;
  QuantConfig quant_;
  std::unique_ptr<nlohmann::json> config_json_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> by_name_;
};

}  // namespace fp4moe
