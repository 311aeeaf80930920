// parse_mla_model_config: the transformers 5.x and older config forms, and what is rejected.
#include <cmath>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/model_config.hpp"
#include "model_test_util.hpp"

using namespace fp4moe;
using namespace fp4moe::model;
using json = nlohmann::json;

namespace {

json golden_config(const std::string& name) {
  std::ifstream f(testing_model::golden_dir(name) + "/model/config.json");
  return json::parse(f);
}

MlaModelConfig parse(const json& j) { return parse_mla_model_config(j, parse_model_config(j, "config.json"), "config.json"); }

std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(MlaModelConfig, YarnMatchesTransformers) {
  const MlaModelConfig c = parse(golden_config("deepseek-v3-tiny-yarn"));
  // transformers 5.17: ROPE_INIT_FUNCTIONS["yarn"](config) and yarn_apply_mscale for this config.
  const float inv_freq[8] = {1.0f, 0.3162277638912201f, 0.10000000149011612f, 0.023914724588394165f,
                             0.005124999675899744f, 0.0008498621755279601f, 2.499999936844688e-05f,
                             7.905694474175107e-06f};
  ASSERT_EQ(c.rope.inv_freq.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(c.rope.inv_freq[size_t(i)], inv_freq[i], 1e-6f * inv_freq[i]) << i;
  EXPECT_NEAR(c.rope.attention_factor, 1.0857263992561355, 1e-6);
  EXPECT_NEAR(c.softmax_scale, 0.2294427735858522, 1e-6);
  EXPECT_EQ(c.q_lora_rank, 0);  // q_lora_rank null: q_proj
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_EQ(c.moe_layer, (std::vector<bool>{false, true, true}));
}

TEST(MlaModelConfig, LegacyRopeScalingAndTopLevelThetaEqualRopeParameters) {
  json j = golden_config("deepseek-v3-tiny-yarn");
  const MlaModelConfig a = parse(j);
  json legacy = j["rope_parameters"];
  const double theta = legacy["rope_theta"].get<double>();
  legacy.erase("rope_theta");
  legacy["type"] = legacy["rope_type"];
  legacy.erase("rope_type");
  j.erase("rope_parameters");
  j["rope_scaling"] = legacy;
  j["rope_theta"] = theta;
  const MlaModelConfig b = parse(j);
  EXPECT_EQ(a.rope.inv_freq, b.rope.inv_freq);
  EXPECT_EQ(a.softmax_scale, b.softmax_scale);
  EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
  // A default rope: theta from the top level, no scaling.
  j.erase("rope_scaling");
  j["rope_theta"] = 50000.0;
  const MlaModelConfig d = parse(j);
  EXPECT_FLOAT_EQ(d.rope.inv_freq[1], 1.0f / std::pow(50000.0f, 2.0f / 16.0f));
  EXPECT_FLOAT_EQ(d.softmax_scale, 1.0f / std::sqrt(48.0f));
}

TEST(MlaModelConfig, IndexerTypesFromListPatternOrFreqOffsetRule) {
  json j = golden_config("glm5-tiny-shared");
  using K = IndexerKind;
  const std::vector<K> fssf = {K::Full, K::Shared, K::Shared, K::Full};
  EXPECT_EQ(parse(j).indexer, fssf);
  j.erase("indexer_types");  // transformers' rule: full iff max(i - offset + 1, 0) % freq == 0
  j["index_topk_freq"] = 3;
  j["index_skip_topk_offset"] = 1;
  EXPECT_EQ(parse(j).indexer, fssf);
  j["index_topk_freq"] = 2;
  j["index_skip_topk_offset"] = 2;  // i = 0, 1: full; then every second
  EXPECT_EQ(parse(j).indexer, (std::vector<K>{K::Full, K::Full, K::Shared, K::Full}));
  j.erase("index_topk_freq");
  j.erase("index_skip_topk_offset");
  EXPECT_EQ(parse(j).indexer, std::vector<K>(4, K::Full));  // defaults: every layer full
  j["index_topk_pattern"] = "FSFS";
  EXPECT_EQ(parse(j).indexer, (std::vector<K>{K::Full, K::Shared, K::Full, K::Shared}));
  j["index_topk_pattern"] = json::array({"full", "full", "shared", "full"});
  EXPECT_EQ(parse(j).indexer, (std::vector<K>{K::Full, K::Full, K::Shared, K::Full}));
}

TEST(MlaModelConfig, MlpLayerTypesAndFirstKDense) {
  json j = golden_config("glm5-tiny-sparse");
  EXPECT_EQ(parse(j).moe_layer, (std::vector<bool>{false, true, true, true}));
  j["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"};
  EXPECT_EQ(parse(j).moe_layer, (std::vector<bool>{false, true, false, true}));
  j.erase("mlp_layer_types");
  j["first_k_dense_replace"] = 2;
  EXPECT_EQ(parse(j).moe_layer, (std::vector<bool>{false, false, true, true}));
}

TEST(MlaModelConfig, UnsupportedValuesAreRejectedWithOneLineNamingThem) {
  const json base = golden_config("glm5-tiny-sparse");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& c) { c["rope_parameters"]["rope_type"] = "llama3"; }, "rope_type 'llama3'"},
      {[](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor"},
      {[](json& c) { c["attention_bias"] = true; }, "attention_bias"},
      {[](json& c) { c["mlp_bias"] = true; }, "mlp_bias"},
      {[](json& c) { c["num_key_value_heads"] = 1; }, "num_key_value_heads"},
      {[](json& c) { c["scoring_func"] = "softmax"; }, "scoring_func"},
      {[](json& c) { c["qk_rope_head_dim"] = 15; }, "qk_rope_head_dim"},
      {[](json& c) { c["indexer_types"] = {"full", "shared"}; }, "indexer_types"},
      {[](json& c) { c["indexer_types"][0] = "shared"; }, "layer 0"},
      {[](json& c) { c["index_topk_pattern"] = "FX"; c.erase("indexer_types"); }, "index_topk_pattern"},
      {[](json& c) { c["q_lora_rank"] = nullptr; }, "q_lora_rank"},
      {[](json& c) { c["index_head_dim"] = 8; }, "index_head_dim"},
      {[](json& c) { c["rope_parameters"]["rope_theta"] = "big"; }, "rope_theta"},
      {[](json& c) { c["max_position_embeddings"] = 0; }, "max_position_embeddings"},
  };
  for (const auto& [edit, needle] : cases) {
    json j = base;
    edit(j);
    const std::string e = error_of(j);
    EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  json v3 = golden_config("deepseek-v3-tiny-yarn");
  v3["moe_layer_freq"] = 2;
  EXPECT_NE(error_of(v3).find("moe_layer_freq"), std::string::npos);
}

TEST(Rope, InterleavedRotatesAdjacentPairsHalfSplitRotatesHalves) {
  const float cos[2] = {0.0f, 1.0f}, sin[2] = {1.0f, 0.0f};  // pair 0 by 90 degrees, pair 1 unchanged
  float a[4] = {1, 2, 3, 4};
  apply_rope(a, 4, cos, sin, RopeLayout::Interleaved);
  EXPECT_EQ(std::vector<float>(a, a + 4), (std::vector<float>{-2, 1, 3, 4}));
  float b[4] = {1, 2, 3, 4};
  apply_rope(b, 4, cos, sin, RopeLayout::HalfSplit);
  EXPECT_EQ(std::vector<float>(b, b + 4), (std::vector<float>{-3, 2, 1, 4}));
}

// Every value the engine sizes something by is range-checked at load: one line naming the key
// and the allowed range, before a request can fail on it (issue 37, item 5).
TEST(MlaModelConfig, OutOfRangeValuesAreRefusedAtLoadNamingTheKeyAndTheRange) {
  const json base = golden_config("glm5-tiny-sparse");
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      // The probe's case: the first request failed the engine on a 13 TB scratch block.
      {[](json& c) { c["index_topk"] = int64_t(1) << 40; }, {"'index_topk'", "out of range", "allowed 0..1024"}},
      {[](json& c) { c["index_topk"] = 1025; }, {"'index_topk'", "allowed 0..1024"}},  // > max_position_embeddings
      {[](json& c) { c["hidden_size"] = 1 << 20; }, {"'hidden_size'", "allowed 1..65536"}},
      {[](json& c) { c["num_hidden_layers"] = 5000; }, {"'num_hidden_layers'", "allowed 1..4096"}},
      {[](json& c) { c["vocab_size"] = int64_t(1) << 30; }, {"'vocab_size'", "allowed 1..16777216"}},
      {[](json& c) { c["intermediate_size"] = int64_t(1) << 30; }, {"'intermediate_size'", "allowed 0..262144"}},
      {[](json& c) { c["moe_intermediate_size"] = 0; }, {"'moe_intermediate_size'", "allowed 1..262144"}},
      {[](json& c) { c["num_attention_heads"] = 4096; c["num_key_value_heads"] = 4096; },
       {"'num_attention_heads'", "allowed 1..1024"}},
      {[](json& c) { c["num_key_value_heads"] = 8; }, {"'num_key_value_heads'", "allowed 1..4"}},
      {[](json& c) { c["num_key_value_heads"] = 3; }, {"not a multiple of num_key_value_heads"}},
      {[](json& c) { c["head_dim"] = 1 << 20; }, {"'head_dim'", "allowed 1..4096"}},
      {[](json& c) { c["n_routed_experts"] = 1 << 20; }, {"'n_routed_experts'", "allowed 1..4096"}},
      {[](json& c) { c["num_experts_per_tok"] = 1000; }, {"'num_experts_per_tok'", "allowed 1..256"}},
      {[](json& c) { c["n_group"] = 32; }, {"'n_group'", "allowed 1..16"}},
      {[](json& c) { c["n_group"] = 3; }, {"do not split into n_group = 3"}},
      {[](json& c) { c["topk_group"] = 5; }, {"'topk_group'", "allowed 1..4"}},  // n_group 4
      {[](json& c) { c["n_shared_experts"] = 1000; }, {"'n_shared_experts'", "allowed 0..64"}},
      {[](json& c) { c["q_lora_rank"] = int64_t(1) << 20; }, {"'q_lora_rank'", "allowed 0..65536"}},
      {[](json& c) { c["kv_lora_rank"] = int64_t(1) << 20; }, {"'kv_lora_rank'", "allowed 1..65536"}},
      {[](json& c) { c["qk_nope_head_dim"] = 0; }, {"'qk_nope_head_dim'", "allowed 1..4096"}},
      {[](json& c) { c["qk_rope_head_dim"] = 8192; }, {"'qk_rope_head_dim'", "allowed 1..4096"}},
      {[](json& c) { c["v_head_dim"] = -1; }, {"'v_head_dim'", "allowed 1..4096"}},
      {[](json& c) { c["index_n_heads"] = 5000; }, {"'index_n_heads'", "allowed 0..1024"}},
      {[](json& c) { c["index_head_dim"] = 5000; }, {"'index_head_dim'", "allowed 0..4096"}},
      {[](json& c) { c["first_k_dense_replace"] = 9; c.erase("mlp_layer_types"); }, {"'first_k_dense_replace'", "allowed 0..4"}},
      {[](json& c) { c["num_nextn_predict_layers"] = 100; }, {"'num_nextn_predict_layers'", "allowed 0..16"}},
      {[](json& c) { c["max_position_embeddings"] = 1; }, {"'max_position_embeddings' = 1", "allowed 2..16777216"}},
      {[](json& c) { c["max_position_embeddings"] = int64_t(1) << 30; }, {"'max_position_embeddings'", "allowed 2.."}},
      {[](json& c) { c.erase("max_position_embeddings"); }, {"'max_position_embeddings' is missing"}},
      {[](json& c) { c["rms_norm_eps"] = 0; }, {"'rms_norm_eps'", "positive"}},
      {[](json& c) { c["rms_norm_eps"] = -1e-6; }, {"'rms_norm_eps'", "out of range"}},
      {[](json& c) { c["rms_norm_eps"] = 10.0; }, {"'rms_norm_eps'", "out of range"}},
      {[](json& c) { c["rope_parameters"]["rope_theta"] = 0.0; }, {"'rope_theta'", "out of range"}},
      {[](json& c) { c["rope_parameters"]["rope_theta"] = -5.0; }, {"'rope_theta'", "out of range"}},
      {[](json& c) { c["rope_parameters"]["rope_theta"] = 1e300; }, {"'rope_theta'", "out of range"}},
      {[](json& c) { c["rope_parameters"].erase("rope_theta"); c["rope_theta"] = -1.0; }, {"'rope_theta'", "out of range"}},
      {[](json& c) { c["routed_scaling_factor"] = 0.0; }, {"routed_scaling_factor"}},
      {[](json& c) { c["routed_scaling_factor"] = 1e9; }, {"'routed_scaling_factor'", "out of range"}},
      // Each field in range, their products not: the sizes are bounded as a whole.
      {[](json& c) {
         c["hidden_size"] = 65536;
         c["n_routed_experts"] = 4096;
         c["n_group"] = 1;
         c["topk_group"] = 1;
         c["moe_intermediate_size"] = 262144;
       },
       {"parameters, over the"}},
      {[](json& c) {
         c["num_hidden_layers"] = 4096;
         c["kv_lora_rank"] = 65536;
         c.erase("mlp_layer_types");
         c.erase("indexer_types");
       },
       {"KV cache of one position", "bytes over all layers"}},
      {[](json& c) {
         c["num_attention_heads"] = 1024;
         c["num_key_value_heads"] = 1024;
         c["v_head_dim"] = 4096;
         c["kv_lora_rank"] = 65536;
         c["num_hidden_layers"] = 1;
         c.erase("mlp_layer_types");
         c.erase("indexer_types");
         c["first_k_dense_replace"] = 0;
       },
       {"step scratch", "bytes, over the"}},
  };
  for (const auto& [edit, needles] : cases) {
    json j = base;
    edit(j);
    const std::string e = error_of(j);
    for (const std::string& needle : needles)
      EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e << "\nconfig: " << j.dump();
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(MlaModelConfig, YarnParametersAreRangeChecked) {
  const json base = golden_config("deepseek-v3-tiny-yarn");
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& c) { c["rope_parameters"]["factor"] = -2.0; }, {"factor", "out of range"}},
      {[](json& c) { c["rope_parameters"]["factor"] = 1e9; }, {"factor", "out of range"}},
      {[](json& c) { c["rope_parameters"]["beta_fast"] = -32.0; }, {"beta_fast", "out of range"}},
      {[](json& c) { c["rope_parameters"]["beta_slow"] = -1.0; }, {"beta_slow", "out of range"}},
      {[](json& c) { c["rope_parameters"]["mscale"] = 1e6; }, {"mscale", "out of range"}},
      {[](json& c) { c["rope_parameters"]["mscale_all_dim"] = -1e6; }, {"mscale_all_dim", "out of range"}},
      {[](json& c) { c["rope_parameters"]["attention_factor"] = 0.0; }, {"attention_factor", "out of range"}},
      {[](json& c) { c["rope_parameters"]["original_max_position_embeddings"] = 0; },
       {"original_max_position_embeddings", "out of range"}},
      {[](json& c) { c["rope_parameters"]["original_max_position_embeddings"] = 1 << 22; },
       {"original_max_position_embeddings", "out of range"}},
  };
  for (const auto& [edit, needles] : cases) {
    json j = base;
    edit(j);
    const std::string e = error_of(j);
    for (const std::string& needle : needles)
      EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(MlaModelConfig, SizesOfTheGoldenConfigsAreFarBelowTheCeilings) {
  for (const char* name : {"glm5-tiny-sparse", "glm5-tiny-shared", "deepseek-v3-tiny-yarn"}) {
    const MlaSizes z = mla_sizes(parse(golden_config(name)));
    EXPECT_GT(z.weight_params, 0) << name;
    EXPECT_LT(z.kv_bytes_per_token, kMaxKvBytesPerToken / 100) << name;
    EXPECT_LT(z.scratch_bytes_per_token, kMaxScratchBytesPerToken / 100) << name;
  }
  // GLM-5's published config (hidden 6144, 78 layers, 256 experts x 2048, 64 heads, 202752
  // positions) stays within every ceiling.
  json j = golden_config("glm5-tiny-sparse");
  j["hidden_size"] = 6144;
  j["num_hidden_layers"] = 78;
  j["n_routed_experts"] = 256;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 2048;
  j["intermediate_size"] = 12288;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 64;
  j["q_lora_rank"] = 2048;
  j["kv_lora_rank"] = 512;
  j["qk_nope_head_dim"] = 192;
  j["qk_rope_head_dim"] = 64;
  j["v_head_dim"] = 256;
  j["index_n_heads"] = 32;
  j["index_head_dim"] = 128;
  j["index_topk"] = 2048;
  j["vocab_size"] = 154880;
  j["max_position_embeddings"] = 202752;
  j["mlp_layer_types"] = json::array();
  for (int l = 0; l < 78; ++l) j["mlp_layer_types"].push_back(l < 3 ? "dense" : "sparse");
  j.erase("indexer_types");
  const std::string e = error_of(j);
  EXPECT_EQ(e, "");
  if (e.empty()) {
    const MlaSizes z = mla_sizes(parse(j));
    EXPECT_GT(z.weight_params, 5e11);
    EXPECT_LT(z.weight_params, 1e12);
  }
}
