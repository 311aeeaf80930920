// Mutated config.json objects through parse_model_config + parse_mla_model_config in the
// normal test build (the fuzzer is fuzz/model_config_fuzz.cpp). Every input must give a
// config or an fp4moe::Error with a one-line message — never a crash or another exception.
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/model_config.hpp"
#include "model_test_util.hpp"

using namespace fp4moe;
using json = nlohmann::json;

namespace {

json random_value(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: return nullptr;
    case 1: return bool(rng() % 2);
    case 2: return int64_t(rng() % 5) - 1;
    case 3: return int64_t(rng() % 100000);
    case 4: return (double(rng() % 1000) - 200.0) / 7.0;
    case 5: return "yarn";
    case 6: return json::array({"full", "shared", "dense", "sparse"});
    case 7: return json::object({{"rope_type", "yarn"}, {"factor", double(rng() % 50)}, {"rope_theta", 10000}});
    case 8: return std::string(size_t(rng() % 4), 'F');
    default: return json::array();
  }
}

void mutate(json& j, std::mt19937_64& rng) {
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  static const char* kExtra[] = {"rope_scaling", "rope_theta", "indexer_types", "index_topk_pattern", "index_topk_freq",
                                 "index_skip_topk_offset", "mlp_layer_types", "q_lora_rank", "rope_interleave",
                                 "original_max_position_embeddings", "num_nextn_predict_layers"};
  const int edits = 1 + int(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    const std::string key = rng() % 4 ? keys[rng() % keys.size()] : kExtra[rng() % 11];
    if (rng() % 5 == 0) {
      j.erase(key);
    } else if (key == "rope_parameters" && j[key].is_object() && rng() % 2) {
      static const char* kRope[] = {"rope_type", "factor", "mscale", "mscale_all_dim", "beta_fast",
                                    "original_max_position_embeddings", "attention_factor", "partial_rotary_factor"};
      j[key][kRope[rng() % 8]] = random_value(rng);
    } else {
      j[key] = random_value(rng);
    }
  }
}

}  // namespace

TEST(ModelConfigFuzzSmoke, MutatedConfigsGiveAConfigOrOneLineError) {
  std::mt19937_64 rng(12);
  int ok = 0, errors = 0;
  for (const char* name : {"glm5-tiny-sparse", "glm5-tiny-shared", "deepseek-v3-tiny-yarn"}) {
    std::ifstream f(testing_model::golden_dir(name) + "/model/config.json");
    const json base = json::parse(f);
    for (int i = 0; i < 1500; ++i) {
      json j = base;
      mutate(j, rng);
      try {
        const ModelConfig b = parse_model_config(j, "config.json");
        const model::MlaModelConfig c = model::parse_mla_model_config(j, b, "config.json");
        ASSERT_EQ(int64_t(c.indexer.size()), c.num_layers);
        ASSERT_EQ(int64_t(c.rope.inv_freq.size()), c.qk_rope_dim / 2);
        for (float x : c.rope.inv_freq) ASSERT_TRUE(std::isfinite(x)) << j.dump();
        ASSERT_TRUE(std::isfinite(c.softmax_scale) && c.softmax_scale > 0) << j.dump();
        ++ok;
      } catch (const Error& e) {
        ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
        ++errors;
      }
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(errors, 100);
}
