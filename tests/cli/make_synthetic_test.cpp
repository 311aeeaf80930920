// `fp4moe make-synthetic` end to end: the built binary writes glm5-tiny, which must open as
// a real GLM-5 NVFP4 checkpoint (config, ModelOpt layout, shared gate/up scale, loadable
// MoE layers), deterministically per seed; bad arguments give exit 1/2 and one line.
// (glm5-layer writes ~5.6 GB and is not run here; it shares every code path but the sizes.)
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/fp4.hpp"

namespace fp4moe {
namespace {

using namespace testing_cli;

TEST(MakeSynthetic, Glm5TinyIsARealCheckpoint) {
  TempDir t("mksyn");
  const fs::path dir = t.path / "model";
  const Result r = run_binary(t.path, "make-synthetic " + dir.string() + " --preset glm5-tiny --seed 5");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("glm5-tiny"), std::string::npos) << r.out;
  for (const char* f : {"config.json", "hf_quant_config.json", "model.safetensors", "sample_input.safetensors"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;

  const auto ck = Checkpoint::open(dir.string());
  const ModelConfig& c = ck->config();
  EXPECT_EQ(c.architecture, "GlmMoeDsaForCausalLM");
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_EQ(c.moe.hidden, 256);
  EXPECT_EQ(c.moe.num_experts, 16);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_EQ(c.moe.scoring, ScoringFunc::Sigmoid);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling, 2.5f);
  EXPECT_EQ(c.moe.shared_inter, 128);
  EXPECT_GT(c.kv_lora_rank, 0);
  EXPECT_GT(c.index_topk, 0);
  EXPECT_EQ(ck->quant().quant_algo, "NVFP4");

  // ModelOpt layout of one expert; gate and up share weight_scale_2.
  const std::string p = "model.layers.1.mlp.experts.3.";
  const TensorInfo* w = ck->find(p + "gate_proj.weight");
  const TensorInfo* s = ck->find(p + "gate_proj.weight_scale");
  const TensorInfo* g = ck->find(p + "gate_proj.weight_scale_2");
  ASSERT_TRUE(w && s && g && ck->find(p + "gate_proj.input_scale"));
  EXPECT_EQ(w->dtype, DType::U8);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(s->dtype, DType::F8_E4M3);
  EXPECT_EQ(s->shape, (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(g->dtype, DType::F32);
  EXPECT_TRUE(g->shape.empty());
  const SafetensorsFile* f = nullptr;
  ck->find(p + "gate_proj.weight_scale_2", &f);
  const TensorInfo* gu = ck->find(p + "up_proj.weight_scale_2");
  ASSERT_TRUE(gu);
  const auto a = f->bytes(*g), b = f->bytes(*gu);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  EXPECT_EQ(ck->find("model.layers.1.mlp.gate.weight")->dtype, DType::BF16);
  EXPECT_EQ(ck->find("model.layers.1.mlp.gate.e_score_correction_bias")->dtype, DType::F32);
  EXPECT_TRUE(ck->find("model.layers.1.self_attn.indexer.wk.weight"));
  EXPECT_TRUE(ck->find("model.embed_tokens.weight"));

  // Both MoE layers load; the dense one is refused.
  for (int64_t layer : {1, 2}) {
    const MoeLayerWeights m = ck->load_moe_layer(layer);
    EXPECT_EQ(m.w13.format, WeightFormat::NVFP4);
    EXPECT_EQ(m.w13.n, 256);
    ASSERT_TRUE(m.shared_w13.has_value());
    // Weights were drawn with std 1/sqrt(K): the dequantized expert must show it (±15 %).
    std::vector<float> d(size_t(m.w13.n * m.w13.k));
    dequantize_rows(m.w13.expert(7), 0, m.w13.n, d.data());
    double ss = 0;
    for (float v : d) ss += double(v) * v;
    EXPECT_NEAR(std::sqrt(ss / double(d.size())), 1.0 / 16.0, 0.15 / 16.0);
  }
  EXPECT_THROW(ck->load_moe_layer(0), Error);
}

TEST(MakeSynthetic, DeterministicPerSeed) {
  TempDir t("mksyn");
  for (const char* name : {"a", "b", "c"}) {
    const std::string seed = std::string(name) == "c" ? "8" : "7";
    ASSERT_EQ(run_binary(t.path, "make-synthetic " + (t.path / name).string() + " --seed " + seed).rc, 0);
  }
  const std::string a = slurp(t.path / "a" / "model.safetensors");
  EXPECT_EQ(a, slurp(t.path / "b" / "model.safetensors"));
  EXPECT_NE(a, slurp(t.path / "c" / "model.safetensors"));
  EXPECT_EQ(slurp(t.path / "a" / "config.json"), slurp(t.path / "c" / "config.json"));
}

TEST(MakeSynthetic, BadArgumentsGiveOneLine) {
  TempDir t("mksyn");
  {
    std::ofstream(t.path / "a_file") << "x";
  }
  struct Case {
    std::string args;
    int rc;
  };
  const std::vector<Case> cases = {
      {"make-synthetic " + (t.path / "m").string() + " --preset glm6", 2},  // unknown preset
      {"make-synthetic", 2},                                                 // no OUT_DIR
      {"make-synthetic " + (t.path / "m").string() + " --seed -3x", 2},      // not a number
      {"make-synthetic " + (t.path / "a_file").string(), 1},                 // OUT_DIR is a file
      {"make-synthetic " + (t.path / "a_file" / "sub").string(), 1},         // cannot create
  };
  for (const Case& c : cases) {
    const Result r = run_binary(t.path, c.args);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.err;
    if (c.rc == 1) {
      EXPECT_EQ(r.err_lines(), 1) << c.args << "\n" << r.err;
      EXPECT_EQ(r.err.rfind("fp4moe: ", 0), 0u) << r.err;
    } else {
      EXPECT_GE(r.err_lines(), 1) << c.args;  // CLI11's usage error (+ "Run with --help")
    }
  }
}

}  // namespace
}  // namespace fp4moe
