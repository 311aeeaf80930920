// config.json (model) and quantization-config parsing for the GLM-5 / DeepSeek-V3 family,
// GLM-4.5 and Qwen3-MoE; module glob matching for ignore / exclude_modules lists.
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
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/json_reader.hpp"

namespace fp4moe {
namespace {

using json = nlohmann::json;

enum class Family { DeepSeek, Glm45, Qwen3 };

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative '*' backtracking: O(|p|·|s|) worst case, no recursion.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi, ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

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

  c.hidden_size = r.integer("hidden_size", std::nullopt, 1);
  c.num_layers = r.integer("num_hidden_layers", std::nullopt, 1);
  FP4MOE_CHECK(c.num_layers <= 4096, "{}: num_hidden_layers = {} is out of range (at most 4096)", path, c.num_layers);
  c.vocab_size = r.integer("vocab_size", std::nullopt, 1);
  c.intermediate_size = r.integer("intermediate_size", 0);
  c.num_attention_heads = r.integer("num_attention_heads", std::nullopt, 1);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads, 1);
  c.head_dim = r.integer("head_dim", c.hidden_size / c.num_attention_heads, 1);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.integer("max_position_embeddings", 0);
  c.rope_theta = r.number("rope_theta", 10000.0);
  if (const json* rp = r.field("rope_parameters"); rp && rp->is_object())  // transformers 5
    c.rope_theta = Reader{*rp, path}.number("rope_theta", c.rope_theta);
  c.hidden_act = r.string("hidden_act", "silu");
  FP4MOE_CHECK(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only silu)", path, c.hidden_act);

  MoeConfig& m = c.moe;
  m.hidden = c.hidden_size;
  m.inter = r.integer("moe_intermediate_size", std::nullopt, 1);
  m.top_k = r.integer("num_experts_per_tok", std::nullopt, 1);
  if (family == Family::Qwen3) {
    m.num_experts = r.integer("num_experts", std::nullopt, 1);
    m.scoring = ScoringFunc::Softmax;
    m.norm_topk_prob = r.boolean("norm_topk_prob", false);
    m.routed_scaling = 1.0f;
    m.n_group = m.topk_group = 1;
    m.shared_inter = r.integer("shared_expert_intermediate_size", 0);
    c.n_shared_experts = m.shared_inter > 0 ? 1 : 0;
    c.decoder_sparse_step = r.integer("decoder_sparse_step", 1, 1);
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
    m.num_experts = r.integer("n_routed_experts", std::nullopt, 1);
    const std::string scoring = r.string("scoring_func", "sigmoid");
    if (scoring == "sigmoid") {
      m.scoring = ScoringFunc::Sigmoid;
    } else if (scoring == "softmax") {
      m.scoring = ScoringFunc::Softmax;
    } else {
      FP4MOE_FAIL("{}: scoring_func '{}' is not supported (sigmoid or softmax)", path, scoring);
    }
    m.norm_topk_prob = r.boolean("norm_topk_prob", true);
    m.routed_scaling = float(r.number("routed_scaling_factor", 1.0));
    m.n_group = r.integer("n_group", 1, 1);
    m.topk_group = r.integer("topk_group", 1, 1);
    c.n_shared_experts = r.integer("n_shared_experts", 0);
    m.shared_inter = c.n_shared_experts * m.inter;
    c.topk_method = r.string("topk_method", family == Family::Glm45 ? "noaux_tc" : "");
    c.first_k_dense_replace = r.integer("first_k_dense_replace", 0);
    c.moe_layer_freq = r.integer("moe_layer_freq", 1, 1);
  }
  FP4MOE_CHECK(m.routed_scaling > 0.0f, "{}: routed_scaling_factor must be positive", path);
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
    c.q_lora_rank = r.integer("q_lora_rank", 0);
    c.kv_lora_rank = r.integer("kv_lora_rank", std::nullopt, 1);
    c.qk_nope_head_dim = r.integer("qk_nope_head_dim", std::nullopt, 1);
    c.qk_rope_head_dim = r.integer("qk_rope_head_dim", std::nullopt, 1);
    c.v_head_dim = r.integer("v_head_dim", std::nullopt, 1);
    c.index_n_heads = r.integer("index_n_heads", 0);
    c.index_head_dim = r.integer("index_head_dim", 0);
    c.index_topk = r.integer("index_topk", 0);
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

// ---- quantization config -------------------------------------------------------------

bool module_glob_match(std::string_view pattern, std::string_view name) {
  if (pattern.substr(0, 3) == "re:") {
    try {
      const std::regex re(std::string(pattern.substr(3)));
      return std::regex_search(name.begin(), name.end(), re, std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;  // parse_quant_config rejects bad regexes up front
    }
  }
  return glob_match(pattern, name);
}

bool QuantConfig::is_ignored(std::string_view module) const {
  for (const std::string& p : ignore) {
    if (module_glob_match(p, module)) return true;
    // A plain module name also covers its children ("model.layers.0.mlp" -> "...mlp.gate_proj").
    if (p.find_first_of("*?") == std::string::npos && p.substr(0, 3) != "re:" && module.size() > p.size() &&
        module.substr(0, p.size()) == p && module[p.size()] == '.')
      return true;
  }
  return false;
}

QuantConfig parse_quant_config(const json& root, const std::string& path) {
  FP4MOE_CHECK(root.is_object(), "{}: quantization config is not a JSON object", path);
  QuantConfig q;
  q.source = path;
  // hf_quant_config.json nests ModelOpt's fields under "quantization".
  const json& j = root.contains("quantization") && root["quantization"].is_object() ? root["quantization"] : root;
  const Reader r{j, path};
  auto read_globs = [&](const char* key) {
    const json* v = r.field(key);
    if (!v) return;
    FP4MOE_CHECK(v->is_array(), "{}: '{}' must be a list of module names or globs", path, key);
    for (const json& g : *v) {
      FP4MOE_CHECK(g.is_string(), "{}: '{}' entry {} is not a string", path, key, g.dump());
      std::string s = g.get<std::string>();
      if (s.substr(0, 3) == "re:") {
        try {
          std::regex re(s.substr(3));
        } catch (const std::regex_error&) {
          FP4MOE_FAIL("{}: '{}' entry '{}' is not a valid regex", path, key, s);
        }
      }
      q.ignore.push_back(std::move(s));
    }
  };

  std::string method = r.string("quant_method");
  const std::string algo = r.string("quant_algo");
  if (method.empty() && !algo.empty()) method = "modelopt";  // hf_quant_config.json has no quant_method
  if (method == "modelopt") {
    q.quant_method = "modelopt";
    q.quant_algo = algo;
    FP4MOE_CHECK(algo == "NVFP4" || algo == "W4A16_NVFP4" || algo == "MXFP4" || algo == "W4A16_MXFP4",
                 "{}: ModelOpt quant_algo '{}' is not supported (NVFP4, W4A16_NVFP4, MXFP4)", path, algo);
    const bool mx = algo.find("MXFP4") != std::string::npos;
    q.group_size = int(r.integer("group_size", mx ? 32 : 16, 1));
    q.activation_quant = algo == "NVFP4" || algo == "MXFP4";
    read_globs("exclude_modules");
    read_globs("ignore");
  } else if (method == "compressed-tensors") {
    q.quant_method = method;
    q.format = r.string("format");
    const json* groups = r.field("config_groups");
    FP4MOE_CHECK(groups && groups->is_object() && !groups->empty(),
                 "{}: compressed-tensors config has no 'config_groups'", path);
    for (auto it = groups->begin(); it != groups->end(); ++it) {
      FP4MOE_CHECK(it.value().is_object(), "{}: config_groups.{} is not an object", path, it.key());
      const Reader g{it.value(), path};
      const std::string fmt = g.string("format", q.format);
      FP4MOE_CHECK(fmt == "nvfp4-pack-quantized" || fmt == "mxfp4-pack-quantized",
                   "{}: compressed-tensors format '{}' is not supported (nvfp4-pack-quantized, mxfp4-pack-quantized)",
                   path, fmt);
      FP4MOE_CHECK(q.format.empty() || q.format == fmt || q.format == "mixed-precision",
                   "{}: config groups mix formats '{}' and '{}'", path, q.format, fmt);
      q.format = fmt;
      if (const json* w = g.field("weights"); w && w->is_object())
        q.group_size = int(Reader{*w, path}.integer("group_size", 0));
      if (const json* a = g.field("input_activations"); a && a->is_object()) q.activation_quant = true;
    }
    const bool mx = q.format == "mxfp4-pack-quantized";
    if (q.group_size == 0) q.group_size = mx ? 32 : 16;
    q.quant_algo = mx ? (q.activation_quant ? "MXFP4" : "W4A16_MXFP4") : (q.activation_quant ? "NVFP4" : "W4A16_NVFP4");
    read_globs("ignore");
  } else if (method == "mxfp4") {
    q.quant_method = method;
    q.quant_algo = "MXFP4";
    q.group_size = 32;
    read_globs("modules_to_not_convert");
    read_globs("ignore");
  } else {
    FP4MOE_FAIL("{}: quant_method '{}' is not supported (modelopt, compressed-tensors, mxfp4)", path, method);
  }
  const int want = q.quant_algo.find("MXFP4") != std::string::npos ? 32 : 16;
  FP4MOE_CHECK(q.group_size == want, "{}: group_size {} does not match {} (needs {})", path, q.group_size,
               q.quant_algo, want);
  return q;
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
