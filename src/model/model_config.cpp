#include "model/model_config.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "format/json_reader.hpp"

namespace fp4moe::model {
namespace {

using json = nlohmann::json;

const json* field(const json& j, const char* key) { return Reader{j, ""}.field(key); }
double number(const json& j, const char* key, double def, const std::string& path) { return Reader{j, path}.number(key, def); }
bool boolean(const json& j, const char* key, bool def, const std::string& path) { return Reader{j, path}.boolean(key, def); }
int64_t integer(const json& j, const char* key, int64_t def, const std::string& path) {
  return Reader{j, path}.integer(key, def);
}

double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// transformers' _compute_yarn_parameters, FP32 where it computes in FP32.
void yarn_inv_freq(RopeSpec& r) {
  const int64_t dim = r.dim;
  const double base = r.theta;
  auto correction_dim = [&](double rot) {
    return (double(dim) * std::log(double(r.original_max_position_embeddings) / (rot * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  r.inv_freq.resize(size_t(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = std::pow(float(base), float(2 * i) / float(dim));
    const float extra = 1.0f / pos_freq;
    const float inter = 1.0f / (float(r.factor) * pos_freq);
    const float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
    const float extra_factor = 1.0f - ramp;
    r.inv_freq[size_t(i)] = inter * (1.0f - extra_factor) + extra * extra_factor;
  }
}

RopeSpec parse_rope(const json& j, int64_t dim, int64_t max_pos, const std::string& path) {
  RopeSpec r;
  r.dim = dim;
  // transformers: rope_scaling (legacy) replaces rope_parameters; rope_theta from the dict,
  // else the top-level rope_theta, else 10000.
  const json* rp = field(j, "rope_scaling");
  const char* where = "rope_scaling";
  if (!rp) {
    rp = field(j, "rope_parameters");
    where = "rope_parameters";
  }
  const json empty = json::object();
  if (rp) FP4MOE_CHECK(rp->is_object(), "{}: '{}' must be an object (got {})", path, where, rp->dump());
  const json& p = rp ? *rp : empty;
  r.theta = number(p, "rope_theta", number(j, "rope_theta", 10000.0, path), path);
  FP4MOE_CHECK(r.theta > 1.0 && r.theta <= 1e12, "{}: rope_theta = {} is out of range (allowed > 1, at most 1e12)",
               path, r.theta);
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (const json* t = field(p, key)) {
      FP4MOE_CHECK(t->is_string(), "{}: {}.{} must be a string", path, where, key);
      type = t->get<std::string>();
      break;
    }
  FP4MOE_CHECK(type == "default" || type == "yarn", "{}: {}.rope_type '{}' is not supported (default or yarn)",
               path, where, type);
  r.type = type;
  const double prf = number(p, "partial_rotary_factor", number(j, "partial_rotary_factor", 1.0, path), path);
  FP4MOE_CHECK(prf == 1.0, "{}: partial_rotary_factor {} is not supported (only 1)", path, prf);
  if (type == "default") {
    r.inv_freq.resize(size_t(dim / 2));
    for (int64_t i = 0; i < dim / 2; ++i)
      r.inv_freq[size_t(i)] = 1.0f / std::pow(float(r.theta), float(2 * i) / float(dim));
    return r;
  }
  // YaRN
  const json* f = field(p, "factor");
  r.original_max_position_embeddings =
      integer(j, "original_max_position_embeddings", integer(p, "original_max_position_embeddings", max_pos, path), path);
  FP4MOE_CHECK(r.original_max_position_embeddings >= 1 && r.original_max_position_embeddings <= max_pos,
               "{}: yarn original_max_position_embeddings = {} is out of range (allowed 1..max_position_embeddings "
               "= {})",
               path, r.original_max_position_embeddings, max_pos);
  r.factor = f ? number(p, "factor", 1.0, path) : double(max_pos) / double(r.original_max_position_embeddings);
  FP4MOE_CHECK(r.factor > 0 && r.factor <= 1e4, "{}: {}.factor = {} is out of range (allowed > 0, at most 1e4)",
               path, where, r.factor);
  r.beta_fast = number(p, "beta_fast", 0.0, path);
  if (r.beta_fast == 0.0) r.beta_fast = 32.0;
  r.beta_slow = number(p, "beta_slow", 0.0, path);
  if (r.beta_slow == 0.0) r.beta_slow = 1.0;
  for (const auto& [key, v] : {std::pair{"beta_fast", r.beta_fast}, std::pair{"beta_slow", r.beta_slow}})
    FP4MOE_CHECK(v > 0 && v <= 1e6, "{}: {}.{} = {} is out of range (allowed > 0, at most 1e6; 0 or absent: the default)",
                 path, where, key, v);
  r.mscale = number(p, "mscale", 0.0, path);
  r.mscale_all_dim = number(p, "mscale_all_dim", 0.0, path);
  for (const auto& [key, v] : {std::pair{"mscale", r.mscale}, std::pair{"mscale_all_dim", r.mscale_all_dim}})
    FP4MOE_CHECK(v >= -100 && v <= 100, "{}: {}.{} = {} is out of range (allowed -100..100)", path, where, key, v);
  r.truncate = boolean(p, "truncate", true, path);
  if (const json* af = field(p, "attention_factor")) {
    r.attention_factor = float(number(p, "attention_factor", 1.0, path));
    FP4MOE_CHECK(r.attention_factor > 0 && r.attention_factor <= 100,
                 "{}: {}.attention_factor = {} is out of range (allowed > 0, at most 100)", path, where,
                 r.attention_factor);
    (void)af;
  } else if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) {
    r.attention_factor = float(yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim));
  } else {
    r.attention_factor = float(yarn_mscale(r.factor, 1.0));
  }
  yarn_inv_freq(r);
  FP4MOE_CHECK(std::isfinite(r.attention_factor) && r.attention_factor > 0,
               "{}: the yarn parameters give an attention factor of {} (mscale, mscale_all_dim, factor)", path,
               r.attention_factor);
  return r;
}

std::vector<IndexerKind> parse_indexer_types(const json& j, int64_t layers, const std::string& path) {
  std::vector<IndexerKind> out;
  auto kind = [&](const std::string& s, int64_t i, const char* key) {
    FP4MOE_CHECK(s == "full" || s == "shared", "{}: {}[{}] = '{}' is neither \"full\" nor \"shared\"", path, key, i, s);
    return s == "full" ? IndexerKind::Full : IndexerKind::Shared;
  };
  if (const json* t = field(j, "indexer_types")) {
    FP4MOE_CHECK(t->is_array() && int64_t(t->size()) == layers,
                 "{}: 'indexer_types' must list \"full\"/\"shared\" for each of the {} layers", path, layers);
    for (size_t i = 0; i < t->size(); ++i) {
      FP4MOE_CHECK((*t)[i].is_string(), "{}: indexer_types[{}] is not a string", path, i);
      out.push_back(kind((*t)[i].get<std::string>(), int64_t(i), "indexer_types"));
    }
  } else if (const json* pat = field(j, "index_topk_pattern")) {
    if (pat->is_string()) {
      const std::string s = pat->get<std::string>();
      for (size_t i = 0; i < s.size(); ++i) {
        FP4MOE_CHECK(s[i] == 'F' || s[i] == 'S', "{}: index_topk_pattern[{}] = '{}' is neither F nor S", path, i,
                     s.substr(i, 1));
        out.push_back(s[i] == 'F' ? IndexerKind::Full : IndexerKind::Shared);
      }
    } else {
      FP4MOE_CHECK(pat->is_array(), "{}: 'index_topk_pattern' must be a string or a list", path);
      for (size_t i = 0; i < pat->size(); ++i) {
        FP4MOE_CHECK((*pat)[i].is_string(), "{}: index_topk_pattern[{}] is not a string", path, i);
        out.push_back(kind((*pat)[i].get<std::string>(), int64_t(i), "index_topk_pattern"));
      }
    }
    FP4MOE_CHECK(int64_t(out.size()) == layers, "{}: index_topk_pattern has {} entries for {} layers", path,
                 out.size(), layers);
  } else {
    const int64_t freq = std::max<int64_t>(integer(j, "index_topk_freq", 1, path), 1);
    const int64_t offset = integer(j, "index_skip_topk_offset", 2, path);
    for (int64_t i = 0; i < layers; ++i)
      out.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? IndexerKind::Full : IndexerKind::Shared);
  }
  FP4MOE_CHECK(out.empty() || out[0] == IndexerKind::Full,
               "{}: layer 0 is a \"shared\" indexer layer but no earlier layer computes a top-k", path);
  return out;
}

}  // namespace

MlaModelConfig parse_mla_model_config(const json& j, const ModelConfig& b, const std::string& path) {
  MlaModelConfig c;
  c.architecture = b.architecture;
  if (b.architecture == "GlmMoeDsaForCausalLM") {
    c.family = Family::GlmMoeDsa;
  } else if (b.architecture == "DeepseekV3ForCausalLM") {
    c.family = Family::DeepseekV3;
  } else if (b.architecture == "DeepseekV32ForCausalLM") {
    c.family = Family::DeepseekV32;
  } else {
    FP4MOE_FAIL("{}: architecture '{}' has no forward pass here (GlmMoeDsaForCausalLM, DeepseekV3ForCausalLM, "
                "DeepseekV32ForCausalLM)",
                path, b.architecture);
  }
  c.vocab = b.vocab_size;
  c.hidden = b.hidden_size;
  c.num_layers = b.num_layers;
  c.intermediate = b.intermediate_size;
  c.num_heads = b.num_attention_heads;
  c.q_lora_rank = b.q_lora_rank;
  c.kv_lora_rank = b.kv_lora_rank;
  c.qk_nope_dim = b.qk_nope_head_dim;
  c.qk_rope_dim = b.qk_rope_head_dim;
  c.v_head_dim = b.v_head_dim;
  c.rms_norm_eps = number(j, "rms_norm_eps", c.family == Family::GlmMoeDsa ? 1e-5 : 1e-6, path);
  FP4MOE_CHECK(c.rms_norm_eps > 0, "{}: rms_norm_eps {} must be positive", path, c.rms_norm_eps);
  c.max_position_embeddings = b.max_position_embeddings;
  FP4MOE_CHECK(c.max_position_embeddings > 0,
               "{}: 'max_position_embeddings' is missing (the forward pass needs the context length)", path);
  c.tie_word_embeddings = boolean(j, "tie_word_embeddings", false, path);
  c.moe = b.moe;
  c.topk_method = b.topk_method;
  {
    const Reader r{j, path};
    c.num_nextn_predict_layers = r.integer("num_nextn_predict_layers", r.integer("num_mtp_layers", 0, 0, kMaxNextnLayers),
                                           0, kMaxNextnLayers);
  }

  FP4MOE_CHECK(!boolean(j, "attention_bias", false, path), "{}: attention_bias true is not supported", path);
  FP4MOE_CHECK(!boolean(j, "mlp_bias", false, path), "{}: mlp_bias true is not supported", path);
  FP4MOE_CHECK(b.num_key_value_heads == b.num_attention_heads,
               "{}: num_key_value_heads = {} differs from num_attention_heads = {} (MLA has one KV head per head)",
               path, b.num_key_value_heads, b.num_attention_heads);
  FP4MOE_CHECK(b.moe.scoring == ScoringFunc::Sigmoid, "{}: scoring_func softmax is not supported for {}", path,
               b.architecture);
  FP4MOE_CHECK(c.qk_rope_dim % 2 == 0, "{}: qk_rope_head_dim {} is odd", path, c.qk_rope_dim);
  FP4MOE_CHECK(c.kv_lora_rank > 0 && c.qk_nope_dim > 0 && c.qk_rope_dim > 0 && c.v_head_dim > 0,
               "{}: {} needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim", path, b.architecture);
  FP4MOE_CHECK(c.intermediate > 0 || b.num_moe_layers() == b.num_layers, "{}: dense layers need intermediate_size",
               path);

  c.rope = parse_rope(j, c.qk_rope_dim, c.max_position_embeddings, path);
  c.softmax_scale = float(1.0 / std::sqrt(double(c.qk_head_dim())));
  if (c.rope.type != "default" && c.rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(c.rope.factor, c.rope.mscale_all_dim);
    c.softmax_scale = float(double(c.softmax_scale) * m * m);
  }
  c.mla_rope = RopeLayout::Interleaved;
  if (c.family == Family::DeepseekV3 && !boolean(j, "rope_interleave", true, path)) c.mla_rope = RopeLayout::HalfSplit;
  c.index_rope = c.family == Family::DeepseekV32 ? RopeLayout::HalfSplit : RopeLayout::Interleaved;

  c.indexer.assign(size_t(c.num_layers), IndexerKind::None);
  if (c.family != Family::DeepseekV3) {
    c.index_n_heads = b.index_n_heads;
    c.index_head_dim = b.index_head_dim;
    c.index_topk = b.index_topk;
    FP4MOE_CHECK(c.index_n_heads > 0 && c.index_head_dim > 0 && c.index_topk > 0,
                 "{}: {} needs index_n_heads, index_head_dim and index_topk", path, b.architecture);
    FP4MOE_CHECK(c.index_head_dim >= c.qk_rope_dim, "{}: index_head_dim {} is smaller than qk_rope_head_dim {}", path,
                 c.index_head_dim, c.qk_rope_dim);
    FP4MOE_CHECK(c.q_lora_rank > 0, "{}: the DSA indexer needs q_lora_rank (its query reads the q LoRA latent)", path);
    if (c.family == Family::GlmMoeDsa) {
      c.indexer = parse_indexer_types(j, c.num_layers, path);
    } else {
      c.indexer.assign(size_t(c.num_layers), IndexerKind::Full);
    }
  }
  c.moe_layer.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) c.moe_layer[size_t(l)] = b.is_moe_layer(l);
  if (c.family == Family::DeepseekV3) {  // transformers: MoE iff layer >= first_k_dense_replace
    FP4MOE_CHECK(b.moe_layer_freq == 1, "{}: moe_layer_freq {} is not supported (transformers' DeepseekV3 uses 1)",
                 path, b.moe_layer_freq);
    for (int64_t l = 0; l < c.num_layers; ++l) c.moe_layer[size_t(l)] = l >= b.first_k_dense_replace;
  }
  FP4MOE_CHECK(std::isfinite(c.softmax_scale) && c.softmax_scale > 0,
               "{}: the attention softmax scale is {} (qk head dims, yarn mscale_all_dim)", path, c.softmax_scale);
  for (float f : c.rope.inv_freq)
    FP4MOE_CHECK(std::isfinite(f), "{}: the rope parameters give a non-finite frequency (rope_theta, yarn factor, "
                 "beta_fast/beta_slow)", path);
  const MlaSizes z = mla_sizes(c);
  FP4MOE_CHECK(z.weight_params <= kMaxWeightParams,
               "{}: the config describes {:.3g} parameters, over the {:.3g} this engine takes (hidden_size, "
               "num_hidden_layers, n_routed_experts, moe_intermediate_size, vocab_size)",
               path, z.weight_params, kMaxWeightParams);
  FP4MOE_CHECK(z.kv_bytes_per_token <= kMaxKvBytesPerToken,
               "{}: the KV cache of one position is {:.3g} bytes over all layers, over the {:.3g} this engine takes "
               "(num_hidden_layers x (kv_lora_rank + qk_rope_head_dim + index_head_dim))",
               path, z.kv_bytes_per_token, kMaxKvBytesPerToken);
  FP4MOE_CHECK(z.scratch_bytes_per_token <= kMaxScratchBytesPerToken,
               "{}: one token's step scratch is {:.3g} bytes, over the {:.3g} this engine takes (heads x head dims, "
               "intermediate sizes, vocab_size, max_position_embeddings, index_topk)",
               path, z.scratch_bytes_per_token, kMaxScratchBytesPerToken);
  return c;
}

MlaSizes mla_sizes(const MlaModelConfig& c) {
  const double H = double(c.hidden), NH = double(c.num_heads), QK = double(c.qk_head_dim());
  const double C = double(c.kv_lora_rank), R = double(c.qk_rope_dim), N = double(c.qk_nope_dim);
  const double V = double(c.v_head_dim), QL = double(c.q_lora_rank);
  const double HI = double(c.index_n_heads), D = double(c.index_head_dim);
  const double E = double(c.moe.num_experts), I = double(c.moe.inter), SI = double(c.moe.shared_inter);
  const double DI = double(c.intermediate), vocab = double(c.vocab), P = double(c.max_position_embeddings);
  MlaSizes z;
  const double attn = (QL > 0 ? QL * H + NH * QK * QL : NH * QK * H) + (C + R) * H + NH * (N + V) * C + H * NH * V;
  const double indexer = HI * D * QL + D * H + HI * H;
  const double moe = E * 3 * I * H + 3 * SI * H + E * H;
  const double layers = double(c.num_layers) + double(c.num_nextn_predict_layers);
  z.weight_params = 2 * vocab * H + layers * (attn + indexer + std::max(moe, 3 * DI * H)) +
                    double(c.num_nextn_predict_layers) * 2 * H * H;
  z.kv_bytes_per_token = layers * (C + R + D) * 4;
  const double act = 3 * H + NH * QK + QL + 2 * (C + R) + D + HI * D + HI + P + 2 * NH * V + NH * (N + R) +
                     2 * NH * C + 2 * std::max({I * double(c.moe.top_k), DI, SI}) + E + vocab;
  z.scratch_bytes_per_token = act * 4 + double(c.index_topk) * 4;
  return z;
}

void rope_cos_sin(const RopeSpec& r, int64_t pos, float* cos, float* sin) {
  const float p = float(pos);
  for (size_t i = 0; i < r.inv_freq.size(); ++i) {
    const float a = r.inv_freq[i] * p;
    cos[i] = std::cos(a) * r.attention_factor;
    sin[i] = std::sin(a) * r.attention_factor;
  }
}

void apply_rope(float* x, int64_t dim, const float* cos, const float* sin, RopeLayout layout) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float& a = layout == RopeLayout::Interleaved ? x[2 * i] : x[i];
    float& b = layout == RopeLayout::Interleaved ? x[2 * i + 1] : x[i + half];
    const float x0 = a, x1 = b;
    a = x0 * cos[i] - x1 * sin[i];
    b = x1 * cos[i] + x0 * sin[i];
  }
}

}  // namespace fp4moe::model
