#include "cli/synthetic_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace fp4moe::cli {

using json = nlohmann::json;

namespace {

// transformers' GlmMoeDsaConfig rule (index_topk_freq / index_skip_topk_offset): layer i runs
// its own indexer iff max(i - offset + 1, 0) % freq == 0, otherwise it reuses the previous top-k.
std::vector<std::string> indexer_pattern(int64_t layers, int64_t freq, int64_t offset) {
  std::vector<std::string> t;
  for (int64_t i = 0; i < layers; ++i) t.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  return t;
}

SyntheticSpec glm5_tiny() {
  // GLM-5's structure at toy size. Grouped routing (n_group 4, topk_group 2) is on so the tiny
  // model exercises it (GLM-5 itself has n_group = topk_group = 1); 16 indexer heads so index
  // scores rarely tie; index_topk 32 < a 64-token prompt so DSA really selects.
  SyntheticSpec s;
  s.architecture = "GlmMoeDsaForCausalLM";
  s.vocab = 1024, s.hidden = 256, s.inter_dense = 512, s.moe_inter = 128;
  s.experts = 16, s.top_k = 4, s.n_group = 4, s.topk_group = 2, s.n_shared = 1;
  s.layers = 3, s.dense_layers = 1, s.mtp_layers = 1;
  s.heads = 4, s.q_lora = 128, s.kv_lora = 64, s.nope_dim = 32, s.rope_dim = 16, s.v_dim = 32;
  s.index_heads = 16, s.index_dim = 32, s.index_topk = 32;
  s.rope_parameters = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  s.rms_norm_eps = 1e-5;
  s.max_positions = 4096;
  return s;
}

}  // namespace

bool SyntheticSpec::has_indexer(int64_t layer) const {
  if (index_heads == 0) return false;
  return layer >= layers || indexer_types.at(size_t(layer)) == "full";
}

const std::vector<std::string>& synthetic_preset_names() {
  static const std::vector<std::string> names = {"glm5-tiny", "glm5-tiny-shared", "deepseek-v3-tiny", "glm5-attn-tiny",
                                                 "deepseek-v3-attn-tiny", "glm5-layer"};
  return names;
}

SyntheticSpec synthetic_preset(const std::string& name, std::optional<int64_t> layers,
                               std::optional<int64_t> dense_layers, std::optional<int64_t> mtp_layers) {
  SyntheticSpec s;
  int64_t freq = 1, offset = 0;  // indexer pattern: every layer "full" unless the preset says
  if (name == "glm5-tiny") {
    s = glm5_tiny();
  } else if (name == "glm5-tiny-shared") {
    // Layers 1 and 3 reuse the previous layer's top-k and have no indexer weights.
    s = glm5_tiny();
    s.layers = 4;
    freq = 2, offset = 1;
  } else if (name == "deepseek-v3-tiny") {
    // DeepSeek-V3 at toy size: no q LoRA (q_proj), YaRN rope as DeepSeek-V3's config has it.
    s = glm5_tiny();
    s.architecture = "DeepseekV3ForCausalLM";
    s.q_lora = 0;
    s.index_heads = s.index_dim = s.index_topk = 0;
    s.rope_parameters = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                         {"mscale", 1.0}, {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096},
                         {"beta_fast", 32}, {"beta_slow", 1}};
    s.rms_norm_eps = 1e-6;
    s.max_positions = 163840;
  } else if (name == "glm5-attn-tiny") {
    // GLM-5's attention dims (64 heads, kv_lora 512, rope 64, nope 192, v 256, indexer 32 x 128)
    // with everything else tiny: the GPU runner's fast attention kernels take these dims (the
    // other tiny presets run its any-dims kernels). index_topk 64 < the tests' prompts.
    s = glm5_tiny();
    s.layers = 2, s.dense_layers = 1, s.mtp_layers = 0;
    s.heads = 64, s.q_lora = 256, s.kv_lora = 512, s.nope_dim = 192, s.rope_dim = 64, s.v_dim = 256;
    s.index_heads = 32, s.index_dim = 128, s.index_topk = 64;
  } else if (name == "deepseek-v3-attn-tiny") {
    // deepseek-v3-tiny with DeepSeek-V3's attention dims (128 heads, no q LoRA, kv_lora 512,
    // rope 64, nope 128, v 128) and no indexer: the fast kernels' dense (page table) decode.
    s = synthetic_preset("deepseek-v3-tiny", std::nullopt, std::nullopt, std::nullopt);
    s.layers = 2, s.dense_layers = 1, s.mtp_layers = 0;
    s.heads = 128, s.kv_lora = 512, s.nope_dim = 128, s.rope_dim = 64, s.v_dim = 128;
  } else if (name == "glm5-layer") {
    // GLM-5's real dimensions (zai-org/GLM-5 config.json); few layers.
    s.architecture = "GlmMoeDsaForCausalLM";
    s.vocab = 154880, s.hidden = 6144, s.inter_dense = 12288, s.moe_inter = 2048;
    s.experts = 256, s.top_k = 8, s.n_group = 1, s.topk_group = 1, s.n_shared = 1;
    s.layers = 2, s.dense_layers = 1, s.mtp_layers = 0;
    s.heads = 64, s.q_lora = 2048, s.kv_lora = 512, s.nope_dim = 192, s.rope_dim = 64, s.v_dim = 256;
    s.index_heads = 32, s.index_dim = 128, s.index_topk = 2048;
    s.rope_parameters = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
    s.rms_norm_eps = 1e-5;
    s.max_positions = 202752;
    s.sharded = true;
  } else {
    FP4MOE_FAIL("unknown preset '{}' (glm5-tiny, glm5-tiny-shared, deepseek-v3-tiny, glm5-attn-tiny, deepseek-v3-attn-tiny or glm5-layer)", name);
  }
  s.preset = name;
  if (layers) s.layers = *layers;
  if (dense_layers) s.dense_layers = *dense_layers;
  if (mtp_layers) s.mtp_layers = *mtp_layers;
  FP4MOE_CHECK(s.layers >= 1, "--layers {}: need at least 1", s.layers);
  FP4MOE_CHECK(s.dense_layers >= 0 && s.dense_layers <= s.layers, "--dense-layers {}: must be in [0, {}]",
               s.dense_layers, s.layers);
  FP4MOE_CHECK(s.mtp_layers >= 0 && s.mtp_layers <= 4, "--mtp-layers {}: must be in [0, 4]", s.mtp_layers);
  if (s.index_heads > 0) s.indexer_types = indexer_pattern(s.layers, freq, offset);
  return s;
}

std::vector<std::string> synthetic_exclude_modules(const SyntheticSpec& s) {
  // NVIDIA's list for GLM-5-NVFP4, with this model's dense and MTP layer numbers.
  std::vector<std::string> ex = {"lm_head", "model.embed_tokens", "*self_attn*", "*shared_experts*", "*mlp.gate"};
  for (int64_t l = 0; l < s.dense_layers; ++l) ex.push_back(fmt::format("model.layers.{}.mlp*", l));
  for (int64_t m = 0; m < s.mtp_layers; ++m) ex.push_back(fmt::format("model.layers.{}.*", s.layers + m));
  return ex;
}

json synthetic_config(const SyntheticSpec& s) {
  json mlp_types = json::array(), layer_types = json::array();
  for (int64_t l = 0; l < s.layers; ++l) {
    mlp_types.push_back(l < s.dense_layers ? "dense" : "sparse");
    layer_types.push_back("deepseek_sparse_attention");
  }
  json c = {
      {"architectures", {s.architecture}},
      {"model_type", s.is_glm() ? "glm_moe_dsa" : "deepseek_v3"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.inter_dense},
      {"moe_intermediate_size", s.moe_inter},
      {"num_hidden_layers", s.layers},
      {"first_k_dense_replace", s.dense_layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.heads},
      {"n_shared_experts", s.n_shared},
      {"n_routed_experts", s.experts},
      {"num_experts_per_tok", s.top_k},
      {"n_group", s.n_group},
      {"topk_group", s.topk_group},
      {"routed_scaling_factor", 2.5},
      {"norm_topk_prob", true},
      {"scoring_func", "sigmoid"},
      {"topk_method", "noaux_tc"},
      {"kv_lora_rank", s.kv_lora},
      {"q_lora_rank", s.q_lora > 0 ? json(s.q_lora) : json(nullptr)},
      {"qk_rope_head_dim", s.rope_dim},
      {"qk_nope_head_dim", s.nope_dim},
      {"qk_head_dim", s.nope_dim + s.rope_dim},
      {"v_head_dim", s.v_dim},
      {"head_dim", s.rope_dim},
      {"rope_interleave", true},
      {"hidden_act", "silu"},
      {"max_position_embeddings", s.max_positions},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_parameters", s.rope_parameters},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", false},
      {"num_nextn_predict_layers", s.mtp_layers},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"pad_token_id", nullptr},
      {"use_cache", true},
      {"dtype", "bfloat16"},
  };
  if (s.is_glm()) {
    c["mlp_layer_types"] = mlp_types;
    c["layer_types"] = layer_types;
    c["index_topk"] = s.index_topk;
    c["index_head_dim"] = s.index_dim;
    c["index_n_heads"] = s.index_heads;
    c["indexer_types"] = s.indexer_types;
    c["indexer_rope_interleave"] = true;
    c["mlp_bias"] = false;
  } else {
    c["moe_layer_freq"] = 1;
  }
  return c;
}

namespace {

using Kind = SyntheticTensor::Kind;

float inv_sqrt(int64_t k) { return 1.0f / std::sqrt(float(k)); }

struct Planner {
  const SyntheticSpec& s;
  std::vector<SyntheticShard> shards;

  void shard(std::string file) { shards.push_back({std::move(file), {}}); }
  void add(std::string name, Kind kind, int64_t rows, int64_t cols, float std_dev, float mean = 0) {
    shards.back().tensors.push_back({std::move(name), kind, rows, cols, std_dev, mean});
  }
  void norm(const std::string& name, int64_t n) { add(name, Kind::Bf16, n, 0, 0.02f, 1.0f); }
  void linear(const std::string& module, int64_t n, int64_t k) { add(module + ".weight", Kind::Bf16, n, k, inv_sqrt(k)); }

  void attention(const std::string& a, bool indexer) {
    const int64_t H = s.hidden, qk = s.nope_dim + s.rope_dim;
    if (s.q_lora > 0) {
      linear(a + ".q_a_proj", s.q_lora, H);
      norm(a + ".q_a_layernorm.weight", s.q_lora);
      linear(a + ".q_b_proj", s.heads * qk, s.q_lora);
    } else {
      linear(a + ".q_proj", s.heads * qk, H);
    }
    linear(a + ".kv_a_proj_with_mqa", s.kv_lora + s.rope_dim, H);
    norm(a + ".kv_a_layernorm.weight", s.kv_lora);
    linear(a + ".kv_b_proj", s.heads * (s.nope_dim + s.v_dim), s.kv_lora);
    linear(a + ".o_proj", H, s.heads * s.v_dim);
    if (!indexer) return;
    linear(a + ".indexer.wq_b", s.index_heads * s.index_dim, s.q_lora);
    linear(a + ".indexer.wk", s.index_dim, H);
    norm(a + ".indexer.k_norm.weight", s.index_dim);
    add(a + ".indexer.k_norm.bias", Kind::Bf16, s.index_dim, 0, 0.02f);
    linear(a + ".indexer.weights_proj", s.index_heads, H);
  }
  void bf16_mlp(const std::string& m, int64_t inter) {
    linear(m + ".gate_proj", inter, s.hidden);
    linear(m + ".up_proj", inter, s.hidden);
    linear(m + ".down_proj", s.hidden, inter);
  }
  void moe(const std::string& m, bool nvfp4_experts) {
    const int64_t H = s.hidden, I = s.moe_inter;
    linear(m + ".gate", s.experts, H);
    add(m + ".gate.e_score_correction_bias", Kind::F32, s.experts, 0, 0.05f);
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::string x = fmt::format("{}.experts.{}", m, e);
      if (nvfp4_experts) {
        add(x, Kind::Nvfp4GateUp, I, H, inv_sqrt(H));
        add(x + ".down_proj", Kind::Nvfp4Linear, H, I, inv_sqrt(I));
      } else {
        bf16_mlp(x, I);
      }
    }
    bf16_mlp(m + ".shared_experts", s.n_shared * I);
  }
  void decoder_layer(int64_t l) {
    const std::string L = fmt::format("model.layers.{}", l);
    const bool mtp = l >= s.layers;
    norm(L + ".input_layernorm.weight", s.hidden);
    norm(L + ".post_attention_layernorm.weight", s.hidden);
    attention(L + ".self_attn", s.has_indexer(l));
    if (l < s.dense_layers)
      bf16_mlp(L + ".mlp", s.inter_dense);
    else
      moe(L + ".mlp", /*nvfp4_experts=*/!mtp);
    if (!mtp) return;
    norm(L + ".enorm.weight", s.hidden);
    norm(L + ".hnorm.weight", s.hidden);
    linear(L + ".eh_proj", s.hidden, 2 * s.hidden);
    norm(L + ".shared_head.norm.weight", s.hidden);
    if (!s.is_glm()) {  // DeepSeek-V3's MTP layer carries its own embedding and head
      add(L + ".embed_tokens.weight", Kind::Bf16, s.vocab, s.hidden, 1.0f);
      linear(L + ".shared_head.head", s.vocab, s.hidden);
    }
  }
};

}  // namespace

std::vector<SyntheticShard> synthetic_plan(const SyntheticSpec& s) {
  Planner p{s, {}};
  const int64_t total = s.layers + s.mtp_layers;
  const int64_t n_shards = s.sharded ? total + 2 : 1;
  auto shard_name = [&](int64_t k) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n_shards); };
  p.shard(s.sharded ? shard_name(0) : "model.safetensors");
  p.add("model.embed_tokens.weight", Kind::Bf16, s.vocab, s.hidden, 1.0f);
  for (int64_t l = 0; l < total; ++l) {
    if (s.sharded) p.shard(shard_name(l + 1));
    p.decoder_layer(l);
  }
  if (s.sharded) p.shard(shard_name(total + 1));
  p.norm("model.norm.weight", s.hidden);
  p.linear("lm_head", s.vocab, s.hidden);
  return p.shards;
}

std::vector<WrittenTensor> written_tensors(const SyntheticTensor& t) {
  const std::vector<int64_t> shape = t.cols ? std::vector<int64_t>{t.rows, t.cols} : std::vector<int64_t>{t.rows};
  auto nvfp4 = [&](const std::string& m) {
    return std::vector<WrittenTensor>{{m + ".weight", DType::U8, {t.rows, t.cols / 2}},
                                      {m + ".weight_scale", DType::F8_E4M3, {t.rows, t.cols / 16}},
                                      {m + ".weight_scale_2", DType::F32, {}},
                                      {m + ".input_scale", DType::F32, {}}};
  };
  switch (t.kind) {
    case Kind::Bf16: return {{t.name, DType::BF16, shape}};
    case Kind::F32: return {{t.name, DType::F32, shape}};
    case Kind::Nvfp4Linear: return nvfp4(t.name);
    case Kind::Nvfp4GateUp: {
      std::vector<WrittenTensor> v = nvfp4(t.name + ".gate_proj");
      for (WrittenTensor& w : nvfp4(t.name + ".up_proj")) v.push_back(std::move(w));
      return v;
    }
  }
  return {};
}

}  // namespace fp4moe::cli
