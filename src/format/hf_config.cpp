// config.json (model) and quantization-config parsing for the GLM-5 / DeepSeek-V3 family,
// GLM-4.5 and Qwen3-MoE (the quantization config: quant_config.cpp).
//
// Field names are those of the Hugging Face configs:
//   GlmMoeDsaForCausalLM (GLM-5), DeepseekV3ForCausalLM (and V3.2's DSA fields):
//     n_routed_experts, num_experts_per_tok, n_group, topk_group, routed_scaling_factor,
//     norm_topk_prob, scoring_func, topk_method, n_shared_experts, moe_intermediate_size,
//     first_k_dense_replace, moe_layer_freq (GLM-5 may give mlp_layer_types instead),
//     q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
//     index_n_heads, index_head_dim, index_topk.
//   Glm4MoeForCausalLM (GLM-4.5): the routing fields above, sigmoid router, no MLA.
//   Qwen3MoeForCausalLM: num_experts, softmax router, norm_topk_prob, no groups,
//     decoder_sparse_step, mlp_only_layers, (shared_expert_intermediate_size: Qwen2-MoE).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/json_reader.hpp"

namespace fp4moe {
namespace {

using json = nlohmann::json;

enum class Family { DeepSeek, Glm45, Qwen3 };

// What config.json may ask for: each bound is far above the supported models (GLM-5,
// DeepSeek-V3: hidden 6144-7168, 61-78 layers, vocab ~155K, 128 heads, 256 experts, top-8,
// ranks <= 1536, 160K-200K positions, index_topk 2048) and keeps every size the engine
// derives from them (model/model_config.cpp adds the bounds on their products) in int64.
constexpr int64_t kMaxHidden = 65536;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t(1) << 24;  // token ids are int32 and a logits row is vocab FP32
constexpr int64_t kMaxIntermediate = int64_t(1) << 18;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxRank = 65536;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxTopK = 256;
constexpr int64_t kMaxSharedExperts = 64;
constexpr int64_t kMinPositions = 2;
constexpr int64_t kMaxPositions = int64_t(1) << 24;
constexpr int64_t kMaxIndexTopk = 65536;
constexpr double kMinEps = 0.0, kMaxEps = 1.0;
constexpr double kMinRopeTheta = 1.0, kMaxRopeTheta = 1e12;
constexpr double kMaxScale = 1e4;

}  // namespace

// ---- model config ------------------------------------------------------------------

ModelConfig parse_model_config(const json& j, const std::string& path) {
  FP4MOE_CHECK(j.is_object(), "{}: config is not a JSON object", path);
  const Reader r{j, path};
  ModelConfig c;
  const json* archs = r.field("architectures");
  FP4MOE_CHECK(archs && archs->is_array() && !archs->empty() && (*archs)[0].is_string(),
               "{}: missing 'architectures' (a list naming the model class)", path);
  c.architecture = (*archs)[0].get<std::string>();
  c.model_type = r.string("model_type");

  Family family;
  if (c.architecture == "GlmMoeDsaForCausalLM" || c.architecture == "DeepseekV3ForCausalLM" ||
      c.architecture == "DeepseekV32ForCausalLM") {
    family = Family::DeepSeek;
  } else if (c.architecture == "Glm4MoeForCausalLM") {
    family = Family::Glm45;
  } else if (c.architecture == "Qwen3MoeForCausalLM") {
    family = Family::Qwen3;
  } else {
    FP4MOE_FAIL("{}: unsupported architecture '{}' (supported: GlmMoeDsaForCausalLM, DeepseekV3ForCausalLM, "
                "Glm4MoeForCausalLM, Qwen3MoeForCausalLM)",
                path, c.architecture);
  }

  c.hidden_size = r.integer("hidden_size", std::nullopt, 1, kMaxHidden);
  c.num_layers = r.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  c.vocab_size = r.integer("vocab_size", std::nullopt, 1, kMaxVocab);
  c.intermediate_size = r.integer("intermediate_size", 0, 0, kMaxIntermediate);
  c.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1, kMaxHeads);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads, 1, c.num_attention_heads);
  FP4MOE_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
               "{}: num_attention_heads = {} is not a multiple of num_key_value_heads = {}", path,
               c.num_attention_heads, c.num_key_value_heads);
  c.head_dim = r.integer("head_dim", std::max<int64_t>(c.hidden_size / c.num_attention_heads, 1), 1, kMaxHeadDim);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6, kMinEps, kMaxEps);
  FP4MOE_CHECK(c.rms_norm_eps > 0, "{}: 'rms_norm_eps' = {} must be positive", path, c.rms_norm_eps);
  // 0: absent (the MoE-only commands need none; the forward pass requires it). At least a
  // prompt token and a generated one.
  c.max_position_embeddings = r.integer("max_position_embeddings", 0, kMinPositions, kMaxPositions);
  c.rope_theta = r.number("rope_theta", 10000.0, kMinRopeTheta, kMaxRopeTheta);
  if (const json* rp = r.field("rope_parameters"); rp && rp->is_object())  // transformers 5
    c.rope_theta = Reader{*rp, path}.number("rope_theta", c.rope_theta, kMinRopeTheta, kMaxRopeTheta);
  c.hidden_act = r.string("hidden_act", "silu");
  FP4MOE_CHECK(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only silu)", path, c.hidden_act);

  MoeConfig& m = c.moe;
  m.hidden = c.hidden_size;
  m.inter = r.integer("moe_intermediate_size", std::nullopt, 1, kMaxIntermediate);
  m.top_k = r.integer("num_experts_per_tok", std::nullopt, 1, kMaxTopK);
  if (family == Family::Qwen3) {
    m.num_experts = r.integer("num_experts", std::nullopt, 1, kMaxExperts);
    m.scoring = ScoringFunc::Softmax;
    m.norm_topk_prob = r.boolean("norm_topk_prob", false);
    m.routed_scaling = 1.0f;
    m.n_group = m.topk_group = 1;
    m.shared_inter = r.integer("shared_expert_intermediate_size", 0, 0, kMaxIntermediate);
    c.n_shared_experts = m.shared_inter > 0 ? 1 : 0;
    c.decoder_sparse_step = r.integer("decoder_sparse_step", 1, 1, c.num_layers);
    if (const json* ml = r.field("mlp_only_layers")) {
      FP4MOE_CHECK(ml->is_array(), "{}: 'mlp_only_layers' must be a list of layer indices", path);
      for (const json& x : *ml) {
        FP4MOE_CHECK(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < c.num_layers,
                     "{}: 'mlp_only_layers' entry {} is not a layer index", path, x.dump());
        c.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
    const std::string scoring = r.string("scoring_func", "softmax");
    FP4MOE_CHECK(scoring == "softmax", "{}: Qwen3-MoE scoring_func '{}' is not supported", path, scoring);
  } else {
    m.num_experts = r.integer("n_routed_experts", std::nullopt, 1, kMaxExperts);
    const std::string scoring = r.string("scoring_func", "sigmoid");
    if (scoring == "sigmoid") {
      m.scoring = ScoringFunc::Sigmoid;
    } else if (scoring == "softmax") {
      m.scoring = ScoringFunc::Softmax;
    } else {
      FP4MOE_FAIL("{}: scoring_func '{}' is not supported (sigmoid or softmax)", path, scoring);
    }
    m.norm_topk_prob = r.boolean("norm_topk_prob", true);
    m.routed_scaling = float(r.number("routed_scaling_factor", 1.0, 0.0, kMaxScale));
    m.n_group = r.integer("n_group", 1, 1, m.num_experts);
    m.topk_group = r.integer("topk_group", 1, 1, m.n_group);
    c.n_shared_experts = r.integer("n_shared_experts", 0, 0, kMaxSharedExperts);
    m.shared_inter = c.n_shared_experts * m.inter;
    c.topk_method = r.string("topk_method", family == Family::Glm45 ? "noaux_tc" : "");
    c.first_k_dense_replace = r.integer("first_k_dense_replace", 0, 0, c.num_layers);
    c.moe_layer_freq = r.integer("moe_layer_freq", 1, 1, c.num_layers);
  }
  FP4MOE_CHECK(m.routed_scaling > 0.0f, "{}: routed_scaling_factor must be positive", path);
  FP4MOE_CHECK(m.shared_inter <= kMaxIntermediate,
               "{}: the shared experts' intermediate size n_shared_experts x moe_intermediate_size = {} is out of range "
               "(at most {})",
               path, m.shared_inter, kMaxIntermediate);
  FP4MOE_CHECK(m.top_k <= m.num_experts, "{}: num_experts_per_tok = {} exceeds the {} experts", path, m.top_k,
               m.num_experts);
  FP4MOE_CHECK(m.num_experts % m.n_group == 0, "{}: {} experts do not split into n_group = {} groups", path,
               m.num_experts, m.n_group);
  FP4MOE_CHECK(m.topk_group <= m.n_group, "{}: topk_group = {} exceeds n_group = {}", path, m.topk_group,
               m.n_group);
  FP4MOE_CHECK(m.top_k <= m.topk_group * (m.num_experts / m.n_group),
               "{}: num_experts_per_tok = {} exceeds the {} experts of the topk_group = {} best groups", path,
               m.top_k, m.topk_group * (m.num_experts / m.n_group), m.topk_group);

  if (family == Family::DeepSeek) {
    c.q_lora_rank = r.integer("q_lora_rank", 0, 0, kMaxRank);
    c.kv_lora_rank = r.integer("kv_lora_rank", std::nullopt, 1, kMaxRank);
    c.qk_nope_head_dim = r.integer("qk_nope_head_dim", std::nullopt, 1, kMaxHeadDim);
    c.qk_rope_head_dim = r.integer("qk_rope_head_dim", std::nullopt, 1, kMaxHeadDim);
    c.v_head_dim = r.integer("v_head_dim", std::nullopt, 1, kMaxHeadDim);
    c.index_n_heads = r.integer("index_n_heads", 0, 0, kMaxHeads);
    c.index_head_dim = r.integer("index_head_dim", 0, 0, kMaxHeadDim);
    // The indexer keeps at most index_topk of the positions: more than the context is no choice.
    const int64_t max_topk = c.max_position_embeddings > 0 ? std::min(kMaxIndexTopk, c.max_position_embeddings)
                                                           : kMaxIndexTopk;
    c.index_topk = r.integer("index_topk", 0, 0, max_topk);
    if (c.architecture == "GlmMoeDsaForCausalLM")
      FP4MOE_CHECK(c.index_n_heads > 0 && c.index_head_dim > 0 && c.index_topk > 0,
                   "{}: GlmMoeDsaForCausalLM needs the indexer fields index_n_heads, index_head_dim, index_topk",
                   path);
  }

  // Which layers are MoE.
  c.moe_layers.assign(size_t(c.num_layers), false);
  const json* types = r.field("mlp_layer_types");  // GLM-5 in transformers 5: "dense" | "sparse"
  if (types && family != Family::Qwen3) {
    FP4MOE_CHECK(types->is_array() && int64_t(types->size()) == c.num_layers,
                 "{}: 'mlp_layer_types' must list one of \"dense\"/\"sparse\" per layer ({} layers)", path,
                 c.num_layers);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const json& t = (*types)[size_t(l)];
      FP4MOE_CHECK(t.is_string() && (t == "dense" || t == "sparse"),
                   "{}: mlp_layer_types[{}] = {} is neither \"dense\" nor \"sparse\"", path, l, t.dump());
      c.moe_layers[size_t(l)] = t == "sparse";
    }
    if (!r.has("first_k_dense_replace")) {
      int64_t k = 0;
      while (k < c.num_layers && !c.moe_layers[size_t(k)]) ++k;
      c.first_k_dense_replace = k;
    }
  } else {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      bool moe;
      if (family == Family::Qwen3) {
        moe = (l + 1) % c.decoder_sparse_step == 0 &&
              std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) == c.mlp_only_layers.end();
      } else {
        moe = l >= c.first_k_dense_replace && l % c.moe_layer_freq == 0;
      }
      c.moe_layers[size_t(l)] = moe;
    }
  }
  FP4MOE_CHECK(c.num_moe_layers() > 0, "{}: no layer is a MoE layer", path);
  return c;
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (layer < 0 || layer >= num_layers) return false;
  if (!moe_layers.empty()) return moe_layers[size_t(layer)];
  return layer >= first_k_dense_replace && layer % std::max<int64_t>(moe_layer_freq, 1) == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += is_moe_layer(l);
  return n;
}

std::string_view tensor_group_format_name(TensorGroupFormat f) {
  switch (f) {
    case TensorGroupFormat::ModelOptNVFP4: return "modelopt-nvfp4";
    case TensorGroupFormat::CompressedNVFP4: return "compressed-tensors-nvfp4";
    case TensorGroupFormat::MXFP4: return "mxfp4";
    case TensorGroupFormat::BF16: return "bf16";
    case TensorGroupFormat::F32: return "f32";
    case TensorGroupFormat::Other: return "other";
  }
  return "?";
}

}  // namespace fp4moe
