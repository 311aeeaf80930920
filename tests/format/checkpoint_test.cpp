// Checkpoint folders: model configs of the four architectures, quant configs and globs,
// recognition of every weight layout (ModelOpt NVFP4, compressed-tensors NVFP4, MXFP4,
// BF16, sharded + index), load_moe_layer stacking, gate/up scale unification, and the
// errors a malformed folder gives.
#include "format/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "format/codecs.hpp"
#include "format/fp4.hpp"
#include "format/tiny_checkpoint.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing_ckpt::glm5_config;
using testing_ckpt::Layout;
using testing_ckpt::TinyModel;

// ---- configs modelled on the real ones (dims shrunk where noted) -----------------------

json deepseek_v3_config() {  // deepseek-ai/DeepSeek-V3
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 163840, "hidden_act": "silu", "aux_loss_alpha": 0.001
  })");
}

json glm45_config() {  // zai-org/GLM-4.5
  return json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151552, "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "first_k_dense_replace": 3, "partial_rotary_factor": 0.5, "rope_theta": 1000000,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 131072, "use_qk_norm": true, "hidden_act": "silu"
  })");
}

json qwen3_config() {  // Qwen/Qwen3-30B-A3B
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 40960, "hidden_act": "silu", "router_aux_loss_coef": 0.001
  })");
}

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error, expected: " << what;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
  }
}

TEST(ModelConfigTest, Glm5) {
  const ModelConfig c = parse_model_config(glm5_config(), "config.json");
  EXPECT_EQ(c.architecture, "GlmMoeDsaForCausalLM");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 78);
  EXPECT_EQ(c.moe.hidden, 6144);
  EXPECT_EQ(c.moe.inter, 2048);
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.n_group, 1);
  EXPECT_EQ(c.moe.scoring, ScoringFunc::Sigmoid);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 2.5f);
  EXPECT_EQ(c.moe.shared_inter, 2048);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(77));
  EXPECT_FALSE(c.is_moe_layer(78));
  EXPECT_EQ(c.num_moe_layers(), 75);
}

TEST(ModelConfigTest, Glm5MlpLayerTypes) {
  json j = glm5_config();
  j.erase("first_k_dense_replace");
  j["num_hidden_layers"] = 4;
  j["mlp_layer_types"] = {"dense", "dense", "sparse", "sparse"};
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.first_k_dense_replace, 2);
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  j["mlp_layer_types"] = {"dense", "moe", "sparse", "sparse"};
  expect_error([&] { parse_model_config(j, "config.json"); }, "mlp_layer_types[1]");
}

TEST(ModelConfigTest, DeepSeekV3) {
  const ModelConfig c = parse_model_config(deepseek_v3_config(), "config.json");
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_EQ(c.moe.hidden, 7168);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.index_topk, 0);  // no indexer before V3.2
  EXPECT_EQ(c.num_moe_layers(), 58);
}

TEST(ModelConfigTest, Glm45) {
  const ModelConfig c = parse_model_config(glm45_config(), "config.json");
  EXPECT_EQ(c.moe.num_experts, 160);
  EXPECT_EQ(c.moe.inter, 1536);
  EXPECT_EQ(c.moe.shared_inter, 1536);
  EXPECT_EQ(c.moe.scoring, ScoringFunc::Sigmoid);
  EXPECT_EQ(c.topk_method, "noaux_tc");  // implied: GLM-4.5 routes with the correction bias
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.kv_lora_rank, 0);
  EXPECT_EQ(c.num_moe_layers(), 89);
}

TEST(ModelConfigTest, Qwen3Moe) {
  json j = qwen3_config();
  ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.scoring, ScoringFunc::Softmax);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 1.0f);
  EXPECT_EQ(c.moe.n_group, 1);
  EXPECT_EQ(c.moe.shared_inter, 0);
  EXPECT_EQ(c.num_moe_layers(), 48);
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j["norm_topk_prob"] = false;
  c = parse_model_config(j, "config.json");
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(3));  // in mlp_only_layers
  EXPECT_TRUE(c.is_moe_layer(5));
  EXPECT_EQ(c.num_moe_layers(), 23);
}

TEST(ModelConfigTest, Errors) {
  json j = glm5_config();
  j["architectures"] = {"LlamaForCausalLM"};
  expect_error([&] { parse_model_config(j, "/m/config.json"); }, "/m/config.json: unsupported architecture 'LlamaForCausalLM'");
  j = glm5_config();
  j.erase("architectures");
  expect_error([&] { parse_model_config(j, "c"); }, "missing 'architectures'");
  j = glm5_config();
  j["hidden_size"] = "6144";
  expect_error([&] { parse_model_config(j, "c"); }, "'hidden_size' must be an integer");
  j = glm5_config();
  j["hidden_size"] = 61.5;
  expect_error([&] { parse_model_config(j, "c"); }, "'hidden_size' must be an integer");
  j = glm5_config();
  j["n_routed_experts"] = -4;
  expect_error([&] { parse_model_config(j, "c"); }, "out of range");
  j = glm5_config();
  j.erase("moe_intermediate_size");
  expect_error([&] { parse_model_config(j, "c"); }, "missing 'moe_intermediate_size'");
  j = glm5_config();
  j["num_experts_per_tok"] = 300;
  expect_error([&] { parse_model_config(j, "c"); }, "'num_experts_per_tok' = 300 is out of range (allowed 1..256)");
  j = glm5_config();
  j["n_routed_experts"] = 8;
  j["n_group"] = j["topk_group"] = 1;
  j["num_experts_per_tok"] = 9;
  expect_error([&] { parse_model_config(j, "c"); }, "exceeds");
  j = deepseek_v3_config();
  j["n_group"] = 7;
  expect_error([&] { parse_model_config(j, "c"); }, "do not split");
  j["n_group"] = 8;
  j["topk_group"] = 1;  // 1 group of 32 experts still holds top-8
  EXPECT_NO_THROW(parse_model_config(j, "c"));
  j["num_experts_per_tok"] = 40;
  expect_error([&] { parse_model_config(j, "c"); }, "best groups");
  j = glm5_config();
  j["scoring_func"] = "relu";
  expect_error([&] { parse_model_config(j, "c"); }, "scoring_func 'relu'");
  j = glm5_config();
  j["hidden_act"] = "gelu";
  expect_error([&] { parse_model_config(j, "c"); }, "hidden_act 'gelu'");
  j = glm5_config();
  j.erase("index_topk");
  expect_error([&] { parse_model_config(j, "c"); }, "indexer fields");
  expect_error([&] { parse_model_config(json::array(), "c"); }, "not a JSON object");
}

// ---- quant configs and globs ------------------------------------------------------------

TEST(QuantConfigTest, ModelOptHfQuantConfig) {
  const QuantConfig q = parse_quant_config(json::parse(R"({
    "producer": {"name": "modelopt", "version": "0.37.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.0.*", "*mlp.gate", "*.self_attn*"]}})"),
                                           "hf_quant_config.json");
  EXPECT_EQ(q.quant_method, "modelopt");
  EXPECT_EQ(q.quant_algo, "NVFP4");
  EXPECT_TRUE(q.activation_quant);
  EXPECT_EQ(q.group_size, 16);
  EXPECT_TRUE(q.is_ignored("lm_head"));
  EXPECT_TRUE(q.is_ignored("model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(q.is_ignored("model.layers.5.mlp.gate"));
  EXPECT_FALSE(q.is_ignored("model.layers.5.mlp.gate_proj"));
  EXPECT_TRUE(q.is_ignored("model.layers.7.self_attn.q_a_proj"));
  EXPECT_FALSE(q.is_ignored("model.layers.10.mlp.experts.3.up_proj"));
}

// The KV cache a checkpoint declares (issue 40: the GPU runner's FP8 KV warning names it).
TEST(QuantConfigTest, KvCacheQuantAlgo) {
  EXPECT_EQ(parse_quant_config(json::parse(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null}})"), "h")
                .kv_cache_quant_algo,
            "");
  EXPECT_EQ(parse_quant_config(json::parse(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}})"), "h")
                .kv_cache_quant_algo,
            "FP8");
  EXPECT_THROW(parse_quant_config(json::parse(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": 8}})"), "h"),
               Error);
  auto with = [](const std::string& kv) {
    return parse_quant_config(json::parse(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}, )" + kv + "}"),
                              "c");
  };
  EXPECT_EQ(with(R"("kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"})").kv_cache_quant_algo, "FP8");
  EXPECT_EQ(with(R"("kv_cache_scheme": {"num_bits": 8, "type": "int"})").kv_cache_quant_algo, "int8");
  EXPECT_EQ(with(R"("kv_cache_scheme": null)").kv_cache_quant_algo, "");
  EXPECT_THROW(with(R"("kv_cache_scheme": "fp8")"), Error);
}

TEST(QuantConfigTest, ModelOptInConfigJsonW4A16) {
  const QuantConfig q = parse_quant_config(
      json::parse(R"({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "ignore": ["lm_head"]})"), "c");
  EXPECT_EQ(q.quant_algo, "W4A16_NVFP4");
  EXPECT_FALSE(q.activation_quant);
  EXPECT_TRUE(q.is_ignored("lm_head"));
  EXPECT_TRUE(q.is_ignored("lm_head.weight"));  // a plain name covers its children
  EXPECT_FALSE(q.is_ignored("lm_headx"));
}

TEST(QuantConfigTest, CompressedTensors) {
  const QuantConfig q = parse_quant_config(json::parse(R"({
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
    "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group"},
      "input_activations": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": "local"}}},
    "ignore": ["lm_head", "re:.*mlp\\.gate$", "model.layers.0.mlp.down_proj"]})"),
                                           "c");
  EXPECT_EQ(q.quant_method, "compressed-tensors");
  EXPECT_EQ(q.format, "nvfp4-pack-quantized");
  EXPECT_EQ(q.quant_algo, "NVFP4");
  EXPECT_TRUE(q.is_ignored("model.layers.3.mlp.gate"));
  EXPECT_FALSE(q.is_ignored("model.layers.3.mlp.gate_proj"));
  EXPECT_TRUE(q.is_ignored("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(q.is_ignored("model.layers.0.mlp.up_proj"));
}

TEST(QuantConfigTest, Mxfp4AndErrors) {
  QuantConfig q = parse_quant_config(
      json::parse(R"({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]})"), "c");
  EXPECT_EQ(q.quant_algo, "MXFP4");
  EXPECT_EQ(q.group_size, 32);
  EXPECT_TRUE(q.is_ignored("model.layers.4.self_attn"));
  q = parse_quant_config(json::parse(R"({"quant_method": "compressed-tensors", "config_groups":
        {"g": {"format": "mxfp4-pack-quantized", "weights": {"group_size": 32}}}})"), "c");
  EXPECT_EQ(q.quant_algo, "W4A16_MXFP4");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method": "gptq"})"), "q.json"); },
               "q.json: quant_method 'gptq'");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_algo": "FP8"})"), "q"); }, "quant_algo 'FP8'");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_algo": "NVFP4", "group_size": 32})"), "q"); },
               "group_size 32");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_algo": "NVFP4", "exclude_modules": "lm_head"})"), "q"); },
               "must be a list");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_algo": "NVFP4", "ignore": ["re:(("]})"), "q"); },
               "not a valid regex");
  expect_error([] { parse_quant_config(json::parse(R"({"quant_method": "compressed-tensors", "config_groups":
        {"g": {"format": "int-quantized"}}})"), "q"); }, "format 'int-quantized'");
}

TEST(GlobTest, FnmatchSemantics) {
  EXPECT_TRUE(module_glob_match("*", ""));
  EXPECT_TRUE(module_glob_match("a*b*c", "axxbyyc"));
  EXPECT_FALSE(module_glob_match("a*b*c", "axxbyy"));
  EXPECT_TRUE(module_glob_match("a?c", "abc"));
  EXPECT_FALSE(module_glob_match("a?c", "ac"));
  EXPECT_TRUE(module_glob_match("*experts.?.up_proj", "model.layers.3.mlp.experts.7.up_proj"));
  EXPECT_FALSE(module_glob_match("*experts.?.up_proj", "model.layers.3.mlp.experts.17.up_proj"));
  EXPECT_TRUE(module_glob_match("re:model\\.layers\\.[0-2]\\.", "model.layers.1.mlp"));
  EXPECT_FALSE(module_glob_match("re:layers", "model.layers.1.mlp"));  // anchored at the start
  EXPECT_TRUE(module_glob_match(std::string(50, '*') + "x", std::string(2000, 'a') + "x"));
}

// "re:" patterns run on PCRE2 with a step limit (issue 37, item 6). The probe's pattern, which
// std::regex searched exponentially, fails at once (PCRE2 first looks for the 'X' it needs);
// one that defeats that shortcut stops at the limit with an error naming it, in milliseconds.
TEST(GlobTest, CatastrophicRegexIsBoundedAndNamed) {
  const std::string name = "model.layers.12.mlp.experts.100.gate_proj.weight";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(module_glob_match("re:(.|.)*X", name));
  EXPECT_TRUE(module_glob_match("re:(.|.)*X", "abX"));
  expect_error([&] { module_glob_match("re:(.|.)*ss$", name); },
               "'re:(.|.)*ss$' is too costly to match against '" + name + "'");
  const QuantConfig q = parse_quant_config(json::parse(R"({"quant_algo": "NVFP4", "exclude_modules": ["re:(a|a)*ab$"]})"), "q");
  expect_error([&] { q.is_ignored(std::string(60, 'a') + "b!"); }, "too costly");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  expect_error([] { parse_quant_config(json{{"quant_algo", "NVFP4"}, {"ignore", {"re:)"}}}, "q.json"); },
               "q.json: 'ignore' entry 're:)' is not a valid regex");
  const std::string huge = "re:" + std::string(5000, 'a');
  expect_error([&] { parse_quant_config(json{{"quant_algo", "NVFP4"}, {"ignore", {huge}}}, "q"); }, "byte limit");
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fp4moe_ck_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::map<TensorGroupFormat, int> count_formats(const Checkpoint& ck) {
    std::map<TensorGroupFormat, int> n;
    for (const TensorGroup& g : ck.groups()) {
      EXPECT_TRUE(g.problems.empty()) << g.prefix << ": " << (g.problems.empty() ? "" : g.problems[0]);
      ++n[g.format];
    }
    return n;
  }

  // The stacked bytes of expert e equal what was written.
  static void expect_stacked(const TinyModel& m, const ExpertStack& s, int64_t e, const std::vector<std::string>& parts,
                             const char* packed_name) {
    size_t packed_off = 0, scale_off = 0, bf16_off = 0;
    for (const std::string& p : parts) {
      if (s.is_fp4()) {
        const auto& pk = m.tensors.at(p + packed_name).bytes;
        const auto& sc = m.tensors.at(p + ".weight_scale").bytes;
        const size_t pe = size_t(s.n * s.k / 2), se = size_t(s.n * s.k / s.block());
        EXPECT_EQ(0, std::memcmp(s.packed.data() + size_t(e) * pe + packed_off, pk.data(), pk.size())) << p;
        EXPECT_EQ(0, std::memcmp(s.scales.data() + size_t(e) * se + scale_off, sc.data(), sc.size())) << p;
        packed_off += pk.size();
        scale_off += sc.size();
      } else {
        const auto& w = m.tensors.at(p + ".weight").bytes;
        EXPECT_EQ(0, std::memcmp(reinterpret_cast<const uint8_t*>(s.expert_bf16(e)) + bf16_off, w.data(), w.size()));
        bf16_off += w.size();
      }
    }
  }

  void check_layer(const TinyModel& m, const Checkpoint& ck, WeightFormat wf) {
    const MoeLayerWeights w = ck.load_moe_layer(1);
    const int64_t E = TinyModel::E, H = TinyModel::H, I = TinyModel::I;
    EXPECT_EQ(w.cfg.num_experts, E);
    EXPECT_EQ(w.router_w.size(), size_t(E * H));
    EXPECT_EQ(w.router_bias.size(), size_t(E));
    EXPECT_EQ(w.w13.format, wf);
    EXPECT_EQ(w.w13.num_experts, E);
    EXPECT_EQ(w.w13.n, 2 * I);
    EXPECT_EQ(w.w13.k, H);
    EXPECT_EQ(w.w2.n, H);
    EXPECT_EQ(w.w2.k, I);
    ASSERT_TRUE(w.shared_w13.has_value());
    EXPECT_EQ(w.shared_w13->num_experts, 1);
    EXPECT_EQ(w.shared_w13->n, 2 * TinyModel::SI);
    EXPECT_EQ(w.shared_w2->k, TinyModel::SI);
    const char* packed = (m.layout == Layout::Compressed || m.layout == Layout::Mxfp4Compressed) ? ".weight_packed" : ".weight";
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = fmt::format("model.layers.1.mlp.experts.{}.", e);
      expect_stacked(m, w.w13, e, {p + "gate_proj", p + "up_proj"}, packed);
      expect_stacked(m, w.w2, e, {p + "down_proj"}, packed);
      if (m.layout == Layout::ModelOpt) {
        float g;
        std::memcpy(&g, m.tensors.at(p + "gate_proj.weight_scale_2").bytes.data(), 4);
        EXPECT_EQ(w.w13.global_scale[size_t(e)], g);
      }
      if (m.layout == Layout::Compressed) {
        float inv;
        std::memcpy(&inv, m.tensors.at(p + "down_proj.weight_global_scale").bytes.data(), 4);
        EXPECT_FLOAT_EQ(w.w2.global_scale[size_t(e)], 1.0f / inv);
      }
      if (wf == WeightFormat::MXFP4) {
        EXPECT_EQ(w.w13.global_scale[size_t(e)], 1.0f);
      }
    }
    // W4A4's static activation global: the largest input_scale of the stack (written by the
    // ModelOpt layout only: 0.01 for every linear).
    const float input_scale = m.layout == Layout::ModelOpt ? 0.01f : 0.0f;
    EXPECT_EQ(w.w13.input_scale, input_scale);
    EXPECT_EQ(w.w2.input_scale, input_scale);
    const auto& rw = m.tensors.at("model.layers.1.mlp.gate.weight").bytes;
    uint16_t h0;
    std::memcpy(&h0, rw.data(), 2);
    EXPECT_EQ(w.router_w[0], bf16_to_float(h0));
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, ModelOptNvfp4) {
  TinyModel m(Layout::ModelOpt);
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck->config().architecture, "GlmMoeDsaForCausalLM");
  EXPECT_EQ(ck->quant().quant_method, "modelopt");
  EXPECT_EQ(ck->quant().quant_algo, "W4A16_NVFP4");
  EXPECT_TRUE(ck->quant().is_ignored("model.layers.1.mlp.gate"));
  EXPECT_EQ(ck->files().size(), 1u);
  auto n = count_formats(*ck);
  EXPECT_EQ(n[TensorGroupFormat::ModelOptNVFP4], TinyModel::E * 3 + 3);
  EXPECT_EQ(n[TensorGroupFormat::BF16], 3 + 1 + 2);  // dense mlp, router, embed + lm_head
  EXPECT_EQ(n[TensorGroupFormat::Other], 0);
  check_layer(m, *ck, WeightFormat::NVFP4);
}

TEST_F(CheckpointTest, StackInputScaleIsTheLargestOfItsExperts) {
  TinyModel m(Layout::ModelOpt);
  m.add_f32("model.layers.1.mlp.experts.2.down_proj.input_scale", {}, {0.03f});
  m.add_f32("model.layers.1.mlp.experts.0.up_proj.input_scale", {}, {0.02f});
  m.write(dir_);
  const MoeLayerWeights w = Checkpoint::open(dir_.string())->load_moe_layer(1);
  EXPECT_EQ(w.w13.input_scale, 0.02f);
  EXPECT_EQ(w.w2.input_scale, 0.03f);
}

TEST_F(CheckpointTest, CompressedTensorsNvfp4) {
  TinyModel m(Layout::Compressed);
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck->quant().quant_method, "compressed-tensors");
  EXPECT_EQ(count_formats(*ck)[TensorGroupFormat::CompressedNVFP4], TinyModel::E * 3 + 3);
  check_layer(m, *ck, WeightFormat::NVFP4);
}

TEST_F(CheckpointTest, Mxfp4BothNamings) {
  for (Layout l : {Layout::Mxfp4, Layout::Mxfp4Compressed}) {
    TinyModel m(l);
    m.write(dir_);
    auto ck = Checkpoint::open(dir_.string());
    EXPECT_EQ(ck->quant().group_size, 32);
    EXPECT_EQ(count_formats(*ck)[TensorGroupFormat::MXFP4], TinyModel::E * 3 + 3);
    check_layer(m, *ck, WeightFormat::MXFP4);
  }
}

TEST_F(CheckpointTest, Bf16) {
  TinyModel m(Layout::Bf16);
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck->quant().quant_method, "");
  EXPECT_EQ(count_formats(*ck)[TensorGroupFormat::BF16], TinyModel::E * 3 + 3 + 6);
  check_layer(m, *ck, WeightFormat::BF16);
}

TEST_F(CheckpointTest, Qwen3NamingSoftmaxNoBias) {
  TinyModel m(Layout::ModelOpt);
  json q = qwen3_config();
  q["hidden_size"] = TinyModel::H;
  q["moe_intermediate_size"] = TinyModel::I;
  q["num_experts"] = TinyModel::E;
  q["num_experts_per_tok"] = 2;
  q["num_hidden_layers"] = 2;
  q["mlp_only_layers"] = {0};
  q["shared_expert_intermediate_size"] = TinyModel::SI;  // Qwen2-MoE style shared expert, ungated
  q["vocab_size"] = TinyModel::Vocab;
  m.config = q;
  m.tensors.erase("model.layers.1.mlp.gate.e_score_correction_bias");
  std::map<std::string, testing_ckpt::RawTensor> renamed;
  for (auto& [name, t] : m.tensors) {
    std::string n = name;
    if (auto p = n.find("shared_experts."); p != std::string::npos) n.replace(p, 15, "shared_expert.");
    renamed[n] = std::move(t);
  }
  m.tensors = std::move(renamed);
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck->config().architecture, "Qwen3MoeForCausalLM");
  const MoeLayerWeights w = ck->load_moe_layer(1);
  EXPECT_EQ(w.cfg.scoring, ScoringFunc::Softmax);
  EXPECT_TRUE(w.router_bias.empty());
  ASSERT_TRUE(w.shared_w13.has_value());
  EXPECT_EQ(w.shared_w13->n, 2 * TinyModel::SI);
  expect_error([&] { ck->load_moe_layer(0); }, "layer 0 is a dense layer");
  // A sigmoid-gated shared expert (shared_expert_gate) cannot be represented: refused.
  m.add_bf16("model.layers.1.mlp.shared_expert_gate.weight", {1, TinyModel::H});
  m.write(dir_);
  expect_error([&] { Checkpoint::open(dir_.string())->load_moe_layer(1); }, "shared_expert_gate");
}

TEST_F(CheckpointTest, GptOssStackedMxfp4IsRecognised) {
  TinyModel m(Layout::Bf16);
  m.tensors["model.layers.1.mlp.experts.gate_up_proj_blocks"] =
      TinyModel::bytes_tensor(DType::U8, {4, 64, 2, 16}, std::vector<uint8_t>(4 * 64 * 32, 0x11));
  m.tensors["model.layers.1.mlp.experts.gate_up_proj_scales"] =
      TinyModel::bytes_tensor(DType::U8, {4, 64, 2}, std::vector<uint8_t>(4 * 64 * 2, 127));
  m.add_f32("model.layers.1.mlp.experts.gate_up_proj_bias", {4, 64});
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  bool found = false;
  for (const TensorGroup& g : ck->groups())
    if (g.prefix == "model.layers.1.mlp.experts.gate_up_proj") {
      found = true;
      EXPECT_EQ(g.format, TensorGroupFormat::MXFP4);
      EXPECT_TRUE(g.problems.empty());
      EXPECT_EQ(g.parts.size(), 3u);
    }
  EXPECT_TRUE(found);
}

TEST_F(CheckpointTest, ShardedWithIndex) {
  TinyModel m(Layout::ModelOpt);
  m.write(dir_, 3);
  auto ck = Checkpoint::open(dir_.string());
  EXPECT_EQ(ck->files().size(), 3u);
  const SafetensorsFile* f = nullptr;
  ASSERT_NE(ck->find("model.layers.1.mlp.experts.2.up_proj.weight", &f), nullptr);
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(count_formats(*ck)[TensorGroupFormat::ModelOptNVFP4], TinyModel::E * 3 + 3);
  check_layer(m, *ck, WeightFormat::NVFP4);
}

TEST_F(CheckpointTest, IndexErrors) {
  TinyModel m(Layout::ModelOpt);
  auto edit_index = [&](const std::function<void(json&)>& f) {
    m.write(dir_, 2);
    json idx = json::parse(std::ifstream(dir_ / "model.safetensors.index.json"));
    f(idx);
    std::ofstream(dir_ / "model.safetensors.index.json") << idx.dump();
  };
  const std::string d = dir_.string();
  edit_index([](json& j) { j["weight_map"]["extra.weight"] = "model-00009-of-00009.safetensors"; });
  expect_error([&] { Checkpoint::open(d); }, "shard 'model-00009-of-00009.safetensors' is listed but missing");
  edit_index([](json& j) { j["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors"; });
  expect_error([&] { Checkpoint::open(d); }, "tensor 'extra.weight' is listed in shard");
  edit_index([](json& j) { j["weight_map"].erase("lm_head.weight"); });
  expect_error([&] { Checkpoint::open(d); }, "tensor 'lm_head.weight' is not listed");
  edit_index([](json& j) { j["weight_map"]["lm_head.weight"] = "../evil.safetensors"; });
  expect_error([&] { Checkpoint::open(d); }, "is not a file name in the folder");
  edit_index([](json& j) { j.erase("weight_map"); });
  expect_error([&] { Checkpoint::open(d); }, "no 'weight_map'");
  edit_index([](json& j) {  // the index points a tensor at the other shard
    const std::string s = j["weight_map"]["lm_head.weight"];
    j["weight_map"]["lm_head.weight"] =
        s == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  });
  expect_error([&] { Checkpoint::open(d); }, "tensor 'lm_head.weight' is listed in shard");
}

TEST_F(CheckpointTest, FolderErrors) {
  expect_error([&] { Checkpoint::open((dir_ / "nope").string()); }, "not a directory");
  fs::create_directories(dir_);
  expect_error([&] { Checkpoint::open(dir_.string()); }, "no config.json");
  std::ofstream(dir_ / "config.json") << "{bad json";
  expect_error([&] { Checkpoint::open(dir_.string()); }, "config.json: not valid JSON");
  std::ofstream(dir_ / "config.json") << glm5_config().dump();
  expect_error([&] { Checkpoint::open(dir_.string()); }, "no model.safetensors");
  std::ofstream(dir_ / "model.safetensors") << "garbage!garbage!";
  expect_error([&] { Checkpoint::open(dir_.string()); }, "model.safetensors: header length");
}

// Non-regular files are refused with one line before open() (issue 37, item 7): a FIFO
// would block open() for good (and a blocked open ignores SIGTERM). Refused before opening,
// so these cannot hang.
TEST_F(CheckpointTest, NonRegularFilesAreRefusedBeforeOpen) {
  TinyModel m(Layout::ModelOpt);
  m.write(dir_);
  const fs::path st = dir_ / "model.safetensors";
  fs::remove(st);
  ASSERT_EQ(::mkfifo(st.c_str(), 0600), 0);
  expect_error([&] { Checkpoint::open(dir_.string()); }, st.string() + ": not a regular file (a FIFO)");
  expect_error([&] { SafetensorsFile::open(st.string()); }, "not a regular file (a FIFO)");
  fs::remove(st);
  fs::create_directories(st);  // a folder named *.safetensors
  expect_error([&] { Checkpoint::open(dir_.string()); }, st.string() + ": not a regular file (a directory)");
  fs::remove(st);
  fs::create_symlink("/dev/null", st);  // a link is followed: a character device
  expect_error([&] { Checkpoint::open(dir_.string()); }, "not a regular file (a character device)");
  fs::remove(st);
  m.write(dir_);
  for (const char* name : {"hf_quant_config.json", "config.json"}) {
    fs::remove(dir_ / name);
    ASSERT_EQ(::mkfifo((dir_ / name).c_str(), 0600), 0);
    expect_error([&] { Checkpoint::open(dir_.string()); }, (dir_ / name).string() + ": not a regular file (a FIFO)");
    m.write(dir_);
  }
  m.write(dir_, 2);
  fs::remove(dir_ / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors.index.json").c_str(), 0600), 0);
  expect_error([&] { Checkpoint::open(dir_.string()); }, "model.safetensors.index.json: not a regular file (a FIFO)");
}

TEST_F(CheckpointTest, GateUpScaleUnification) {
  // Gate and up quantized independently: two different weight_scale_2.
  TinyModel m(Layout::ModelOpt);
  const int64_t I = TinyModel::I, H = TinyModel::H;
  const std::vector<float> gate = m.random_matrix(I, H, 1.0f), up = m.random_matrix(I, H, 3.0f);
  const Fp4Matrix qg = quantize_nvfp4(gate.data(), I, H), qu = quantize_nvfp4(up.data(), I, H);
  ASSERT_LT(qg.global_scale, qu.global_scale);
  const std::string p = "model.layers.1.mlp.experts.1.";
  m.tensors[p + "gate_proj.weight"] = TinyModel::bytes_tensor(DType::U8, {I, H / 2}, qg.packed);
  m.tensors[p + "gate_proj.weight_scale"] = TinyModel::bytes_tensor(DType::F8_E4M3, {I, H / 16}, qg.scales);
  m.add_f32(p + "gate_proj.weight_scale_2", {}, {qg.global_scale});
  m.tensors[p + "up_proj.weight"] = TinyModel::bytes_tensor(DType::U8, {I, H / 2}, qu.packed);
  m.tensors[p + "up_proj.weight_scale"] = TinyModel::bytes_tensor(DType::F8_E4M3, {I, H / 16}, qu.scales);
  m.add_f32(p + "up_proj.weight_scale_2", {}, {qu.global_scale});
  m.write(dir_);
  const MoeLayerWeights w = Checkpoint::open(dir_.string())->load_moe_layer(1);
  ASSERT_EQ(w.w13.global_scale[1], qu.global_scale);  // the larger
  const Fp4MatrixView v = w.w13.expert(1);
  // Up rows are untouched; gate scales are rescaled by g_gate / g_up, rounded to E4M3.
  const size_t sp = size_t(I * H / 16);
  EXPECT_EQ(0, std::memcmp(v.scales + sp, qu.scales.data(), sp));
  const float ratio = qg.global_scale / qu.global_scale;
  for (size_t i = 0; i < sp; ++i)
    ASSERT_EQ(v.scales[i], e4m3_from_float(e4m3_to_float(qg.scales[i]) * ratio)) << i;
  // Dequantized gate stays close to the original gate dequantization.
  std::vector<float> got(size_t(2 * I * H)), ref(size_t(I * H));
  dequantize_rows(v, 0, 2 * I, got.data());
  dequantize_rows(qg.view(), 0, I, ref.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  // E4M3 has 3 mantissa bits: re-rounding a scale moves it by at most 2^-4 relative
  // (blocks that fall into E4M3 subnormals can lose more, hence the 10 % bound overall).
  EXPECT_LT(std::sqrt(num / den), 0.1);
  EXPECT_GT(std::sqrt(num / den), 0.0);  // something was rescaled
  // Other experts share their scale already.
  EXPECT_EQ(0, std::memcmp(w.w13.expert(0).scales, m.tensors.at("model.layers.1.mlp.experts.0.gate_proj.weight_scale").bytes.data(), sp));
}

TEST_F(CheckpointTest, LoadErrors) {
  const std::string d = dir_.string();
  auto with = [&](const std::function<void(TinyModel&)>& f) {
    TinyModel m(Layout::ModelOpt);
    f(m);
    m.write(dir_);
    return Checkpoint::open(d);
  };
  auto ck = with([](TinyModel&) {});
  expect_error([&] { ck->load_moe_layer(2); }, "layer 2 is out of range");
  expect_error([&] { ck->load_moe_layer(-1); }, "out of range");
  expect_error([&] { ck->load_moe_layer(0); }, "layer 0 is a dense layer");

  const std::string p = "model.layers.1.mlp.experts.2.";
  ck = with([&](TinyModel& m) { m.tensors[p + "up_proj.weight_scale"].bytes[5] = 0x7F; });
  expect_error([&] { ck->load_moe_layer(1); }, "NaN block scale (code 0x7f) at row 1, block 1");
  ck = with([&](TinyModel& m) { m.tensors[p + "down_proj.weight_scale"].bytes[3] = 0xFF; });
  expect_error([&] { ck->load_moe_layer(1); }, "NaN block scale");
  ck = with([&](TinyModel& m) { m.add_f32(p + "gate_proj.weight_scale_2", {}, {NAN}); });
  expect_error([&] { ck->load_moe_layer(1); }, "is not a finite positive scale");
  ck = with([&](TinyModel& m) { m.add_f32(p + "gate_proj.weight_scale_2", {}, {0.0f}); });
  expect_error([&] { ck->load_moe_layer(1); }, "is not a finite positive scale");
  ck = with([&](TinyModel& m) { m.add_f32(p + "gate_proj.weight_scale_2", {2}, {1.0f, 1.0f}); });
  expect_error([&] { ck->load_moe_layer(1); }, "must be one F32 value");
  ck = with([&](TinyModel& m) {
    auto& t = m.tensors["model.layers.1.mlp.gate.weight"];
    const uint16_t inf = 0x7F80;
    std::memcpy(t.bytes.data() + 10, &inf, 2);
  });
  expect_error([&] { ck->load_moe_layer(1); }, "router 'model.layers.1.mlp.gate.weight' has a non-finite value");
  ck = with([&](TinyModel& m) { m.add_f32("model.layers.1.mlp.gate.e_score_correction_bias", {4}, {0, NAN, 0, 0}); });
  expect_error([&] { ck->load_moe_layer(1); }, "non-finite");
  ck = with([&](TinyModel& m) { m.tensors.erase("model.layers.1.mlp.gate.e_score_correction_bias"); });
  expect_error([&] { ck->load_moe_layer(1); }, "noaux_tc needs");
  ck = with([&](TinyModel& m) { m.tensors.erase(p + "down_proj.weight"); });
  expect_error([&] { ck->load_moe_layer(1); }, "missing tensor 'model.layers.1.mlp.experts.2.down_proj.weight'");
  ck = with([&](TinyModel& m) { m.tensors[p + "up_proj.weight"].shape = {TinyModel::I / 2, TinyModel::H}; });
  expect_error([&] { ck->load_moe_layer(1); }, "has shape [16, 64], expected [32, 32]");
  ck = with([&](TinyModel& m) { m.tensors[p + "up_proj.weight_scale"].dtype = DType::U8; });
  expect_error([&] { ck->load_moe_layer(1); }, "up_proj");
  ck = with([&](TinyModel& m) {  // one expert in BF16 among NVFP4 ones
    for (const char* s : {"weight", "weight_scale", "weight_scale_2", "input_scale"}) m.tensors.erase(p + "down_proj." + s);
    m.add_bf16(p + "down_proj.weight", {TinyModel::H, TinyModel::I});
  });
  expect_error([&] { ck->load_moe_layer(1); }, "is bf16 but");
  ck = with([&](TinyModel& m) { m.tensors["model.layers.1.mlp.gate.weight"].shape = {TinyModel::E, TinyModel::H / 2}; m.tensors["model.layers.1.mlp.gate.weight"].bytes.resize(TinyModel::E * TinyModel::H); });
  expect_error([&] { ck->load_moe_layer(1); }, "has shape [4, 32], expected [4, 64]");
  ck = with([&](TinyModel& m) {
    for (const char* part : {"gate_proj", "up_proj", "down_proj"})
      for (const char* s : {"weight", "weight_scale", "weight_scale_2", "input_scale"})
        m.tensors.erase(std::string("model.layers.1.mlp.shared_experts.") + part + "." + s);
  });
  expect_error([&] { ck->load_moe_layer(1); }, "shared expert");
}

TEST_F(CheckpointTest, GroupProblemsAreListed) {
  TinyModel m(Layout::ModelOpt);
  const std::string p = "model.layers.1.mlp.experts.3.gate_proj";
  m.tensors.erase(p + ".weight_scale_2");
  m.tensors[p + ".weight_scale"].shape = {TinyModel::I, TinyModel::H / 32};
  m.tensors[p + ".weight_scale"].bytes.resize(size_t(TinyModel::I * TinyModel::H / 32));
  m.tensors["stray.weight_scale"] = TinyModel::bytes_tensor(DType::F8_E4M3, {4}, {1, 2, 3, 4});
  m.write(dir_);
  auto ck = Checkpoint::open(dir_.string());
  std::vector<std::string> problems;
  for (const TensorGroup& g : ck->groups())
    for (const std::string& s : g.problems) problems.push_back(s);
  ASSERT_EQ(problems.size(), 3u);
  std::string all;
  for (auto& s : problems) all += s + "|";
  EXPECT_NE(all.find(p + ": packed weight [32, 32] and scales [32, 2] do not match"), std::string::npos) << all;
  EXPECT_NE(all.find(p + ": missing weight_scale_2"), std::string::npos) << all;
  EXPECT_NE(all.find("stray: scales without a weight"), std::string::npos) << all;
}

}  // namespace
}  // namespace fp4moe
