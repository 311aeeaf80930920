// `fp4moe make-synthetic` end to end: the built binary writes the tiny presets, which must
// open as real GLM-5 / DeepSeek-V3 NVFP4 checkpoints (config, NVIDIA's ModelOpt layout: routed
// experts NVFP4 with input_scale, everything else BF16, an MTP layer), with exactly the tensor
// names and shapes transformers' GlmMoeDsaForCausalLM / DeepseekV3ForCausalLM have (the
// fixtures under fixtures/make_synthetic/ come from transformers itself, written by
// tools/oracle/check_synthetic.py), deterministically per seed; glm5-layer is checked through
// --list and --config-only (writing it takes ~10 GB); bad arguments give exit 1/2 and one line.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run_helpers.hpp"
#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/fp4.hpp"

namespace fp4moe {
namespace {

using namespace testing_cli;

const fs::path kFixtures = fs::path(FP4MOE_SOURCE_DIR) / "tests" / "cli" / "fixtures" / "make_synthetic";

struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// "name [d0,d1]" lines: what transformers expects (checkpoint names, BF16 view).
std::set<std::string> fixture(const std::string& preset) {
  std::ifstream f(kFixtures / (preset + ".hf_tensors.txt"));
  EXPECT_TRUE(f.good()) << preset;
  std::set<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.insert(l);
  return lines;
}

// The logical tensors of a ModelOpt checkpoint as "name [shape]" lines: an NVFP4 linear
// (weight U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] + weight_scale_2 F32 [] +
// input_scale F32 []) becomes "weight [N, K]"; checks the parts' dtypes and shapes on the way.
// nvfp4: the modules found quantized.
std::set<std::string> logical(const std::map<std::string, Entry>& t, std::set<std::string>* nvfp4) {
  std::set<std::string> lines;
  auto has = [&](const std::string& n, const char* dt, const std::vector<int64_t>& shape) {
    auto it = t.find(n);
    return it != t.end() && it->second.dtype == dt && it->second.shape == shape;
  };
  for (const auto& [name, e] : t) {
    const auto ends = [&](const std::string& suf) {
      return name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (ends(".weight_scale") || ends(".weight_scale_2") || ends(".input_scale")) continue;
    if (e.dtype == "U8" && ends(".weight")) {
      const std::string m = name.substr(0, name.size() - 7);
      const int64_t n = e.shape.at(0), k = 2 * e.shape.at(1);
      EXPECT_TRUE(has(m + ".weight_scale", "F8_E4M3", {n, k / 16})) << m;
      EXPECT_TRUE(has(m + ".weight_scale_2", "F32", {})) << m;
      EXPECT_TRUE(has(m + ".input_scale", "F32", {})) << m;
      nvfp4->insert(m);
      lines.insert(name + " " + shape_str({n, k}));
    } else {
      lines.insert(name + " " + shape_str(e.shape));
    }
  }
  return lines;
}

std::map<std::string, Entry> read_dir(const fs::path& dir) {
  std::map<std::string, Entry> t;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string n = f.path().filename().string();
    if (n.rfind("model", 0) != 0 || f.path().extension() != ".safetensors") continue;
    const auto st = SafetensorsFile::open(f.path().string());
    for (const TensorInfo& i : st->tensors()) t[i.name] = {std::string(dtype_name(i.dtype)), i.shape};
  }
  return t;
}

// `--list` lines: "name dtype [d0,d1] file".
std::map<std::string, Entry> parse_list(const std::string& out) {
  std::map<std::string, Entry> t;
  std::istringstream in(out);
  for (std::string name, dtype, shape, file; in >> name >> dtype >> shape >> file;) {
    Entry e{dtype, {}};
    std::stringstream ss(shape.substr(1, shape.size() - 2));
    for (std::string d; std::getline(ss, d, ',');) e.shape.push_back(std::stoll(d));
    t[name] = e;
  }
  return t;
}

void expect_same(const std::set<std::string>& got, const std::set<std::string>& want, const std::string& what) {
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
  std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
  EXPECT_TRUE(missing.empty() && extra.empty())
      << what << ": " << missing.size() << " missing (first: " << (missing.empty() ? "" : missing[0]) << "), "
      << extra.size() << " extra (first: " << (extra.empty() ? "" : extra[0]) << ")";
}

// Routed experts of the decoder layers are NVFP4; the MTP layers' experts and every other
// linear are BF16; e_score_correction_bias F32.
void expect_nvidia_layout(const std::map<std::string, Entry>& t, const std::set<std::string>& nvfp4, int64_t layers,
                          int64_t dense) {
  for (int64_t l = dense; l < layers; ++l)
    EXPECT_TRUE(nvfp4.count(fmt::format("model.layers.{}.mlp.experts.0.gate_proj", l))) << l;
  for (const std::string& m : nvfp4) {
    const int64_t l = std::stoll(m.substr(13));  // "model.layers."
    EXPECT_TRUE(m.find(".mlp.experts.") != std::string::npos && l < layers) << m << " should be BF16";
  }
  for (const auto& [name, e] : t) {
    const std::string m = name.substr(0, name.rfind('.'));
    if (nvfp4.count(m)) continue;
    const bool bias = name.find("e_score_correction_bias") != std::string::npos;
    EXPECT_EQ(e.dtype, bias ? "F32" : "BF16") << name;
  }
}

class MakeSyntheticPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(MakeSyntheticPreset, TensorsAreTransformersOnesInNvidiasLayout) {
  const std::string preset = GetParam();
  TempDir t("mksyn_" + preset);
  const fs::path dir = t.path / "model";
  const Result r = run_binary(t.path, "make-synthetic " + dir.string() + " --preset " + preset + " --seed 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find(preset), std::string::npos) << r.out;
  const auto tensors = read_dir(dir);
  std::set<std::string> nvfp4;
  expect_same(logical(tensors, &nvfp4), fixture(preset), preset);

  const auto ck = Checkpoint::open(dir.string());
  const ModelConfig& c = ck->config();
  expect_nvidia_layout(tensors, nvfp4, c.num_layers, c.first_k_dense_replace);
  EXPECT_EQ(ck->quant().quant_algo, "NVFP4");
  EXPECT_TRUE(ck->quant().activation_quant);
  const auto cfg = nlohmann::json::parse(slurp(dir / "config.json"));
  EXPECT_EQ(cfg["num_nextn_predict_layers"], 1);
  // Every MoE layer loads (BF16 shared expert beside NVFP4 routed experts).
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    const MoeLayerWeights m = ck->load_moe_layer(l);
    EXPECT_EQ(m.w13.format, WeightFormat::NVFP4) << l;
    ASSERT_TRUE(m.shared_w13.has_value());
    EXPECT_EQ(m.shared_w13->format, WeightFormat::BF16) << l;
  }

  // --list describes exactly the files.
  const Result list = run_binary(t.path, "make-synthetic " + (t.path / "unused").string() + " --preset " + preset + " --list");
  ASSERT_EQ(list.rc, 0) << list.err;
  EXPECT_FALSE(fs::exists(t.path / "unused"));
  const auto listed = parse_list(list.out);
  EXPECT_EQ(listed.size(), tensors.size());
  for (const auto& [name, e] : tensors) {
    auto it = listed.find(name);
    ASSERT_NE(it, listed.end()) << name;
    EXPECT_EQ(it->second.dtype, e.dtype) << name;
    EXPECT_EQ(it->second.shape, e.shape) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, MakeSyntheticPreset,
                         ::testing::Values("glm5-tiny", "glm5-tiny-shared", "deepseek-v3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(MakeSynthetic, Glm5LayerPlanIsTransformersGlm5) {
  TempDir t("mksyn");
  const std::string args = " --preset glm5-layer --layers 2 --dense-layers 1 --mtp-layers 1";
  const Result list = run_binary(t.path, "make-synthetic " + (t.path / "m").string() + args + " --list");
  ASSERT_EQ(list.rc, 0) << list.err;
  const auto plan = parse_list(list.out);
  std::set<std::string> nvfp4;
  expect_same(logical(plan, &nvfp4), fixture("glm5-layer"), "glm5-layer");
  expect_nvidia_layout(plan, nvfp4, 2, 1);
  EXPECT_EQ(nvfp4.size(), 256u * 3);

  const Result cfg = run_binary(t.path, "make-synthetic " + (t.path / "m").string() + args + " --config-only");
  ASSERT_EQ(cfg.rc, 0) << cfg.err;
  const ModelConfig c = parse_model_config(nlohmann::json::parse(slurp(t.path / "m" / "config.json")), "config.json");
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.moe.num_experts, 256);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.inter, 2048);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_FALSE(fs::exists(t.path / "m" / "model-00001-of-00005.safetensors"));
}

TEST(MakeSynthetic, Glm5TinyIsARealCheckpoint) {
  TempDir t("mksyn");
  const fs::path dir = t.path / "model";
  const Result r = run_binary(t.path, "make-synthetic " + dir.string() + " --preset glm5-tiny --seed 5");
  ASSERT_EQ(r.rc, 0) << r.err;
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
  EXPECT_EQ(c.index_n_heads, 16);  // scores rarely tie
  EXPECT_LT(c.index_topk, 64);     // a 64-token prompt really selects

  // ModelOpt layout of one expert; gate and up share weight_scale_2.
  const std::string p = "model.layers.1.mlp.experts.3.";
  const TensorInfo* w = ck->find(p + "gate_proj.weight");
  const TensorInfo* s = ck->find(p + "gate_proj.weight_scale");
  const TensorInfo* g = ck->find(p + "gate_proj.weight_scale_2");
  ASSERT_TRUE(w && s && g && ck->find(p + "gate_proj.input_scale"));
  EXPECT_EQ(w->shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(s->shape, (std::vector<int64_t>{128, 16}));
  const SafetensorsFile* f = nullptr;
  ck->find(p + "gate_proj.weight_scale_2", &f);
  const TensorInfo* gu = ck->find(p + "up_proj.weight_scale_2");
  ASSERT_TRUE(gu);
  const auto a = f->bytes(*g), b = f->bytes(*gu);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  EXPECT_EQ(ck->find("model.layers.3.eh_proj.weight")->shape, (std::vector<int64_t>{256, 512}));  // MTP layer

  for (int64_t layer : {1, 2}) {
    const MoeLayerWeights m = ck->load_moe_layer(layer);
    EXPECT_EQ(m.w13.n, 256);
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
      {"make-synthetic " + (t.path / "m").string() + " --layers 0", 2},      // not positive
      {"make-synthetic " + (t.path / "m").string() + " --dense-layers 9", 1},  // more than --layers
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
