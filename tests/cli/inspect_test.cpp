// `fp4moe inspect DIR` end to end: the built binary on synthetic checkpoint folders of
// every layout, a folder with problems, and folders that cannot be opened.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "format/tiny_checkpoint.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using testing_ckpt::Layout;
using testing_ckpt::TinyModel;

struct Result {
  int rc = -1;
  std::string out, err;
};

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fp4moe_inspect_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_TRUE(fs::exists(binary_)) << binary_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  Result run(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = binary_ + " " + args + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static void expect_one_line_error(const Result& r, const std::string& what) {
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("fp4moe: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
  }

  fs::path dir_;
  std::string binary_ = FP4MOE_BINARY_DIR "/bin/fp4moe";
};

TEST_F(InspectTest, ModelOptShardedFolder) {
  TinyModel m(Layout::ModelOpt);
  const fs::path ck = dir_ / "ck";
  m.write(ck, 2);
  const Result r = run(ck.string());
  ASSERT_EQ(r.rc, 2) << "a bare DIR must be a usage error; the subcommand is required";
  const Result i = run("inspect " + ck.string());
  EXPECT_EQ(i.rc, 0) << i.err;
  for (const char* want :
       {"architecture: GlmMoeDsaForCausalLM (model_type glm_moe_dsa)", "layers:       2 (1 dense: 0; 1 MoE: 1)",
        "4 routed x intermediate 32, top-2; sigmoid router, n_group 2, topk_group 1, topk_method noaux_tc",
        "shared:       1 expert(s), intermediate 32", "MLA:          q_lora_rank 2048, kv_lora_rank 512",
        "indexer:      32 heads x 128, top-2048 tokens", "quantization: modelopt W4A16_NVFP4 (group 16)",
        "files:        2 safetensors file(s)", "routed experts  12 modelopt-nvfp4", "shared experts  3 modelopt-nvfp4",
        "router          1 bf16", "dense mlp       3 bf16", "modelopt-nvfp4                 15 groups",
        "problems: none"})
    EXPECT_NE(i.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << i.out;
}

TEST_F(InspectTest, EveryLayout) {
  const std::pair<Layout, const char*> cases[] = {{Layout::Compressed, "routed experts  12 compressed-tensors-nvfp4"},
                                                  {Layout::Mxfp4, "routed experts  12 mxfp4"},
                                                  {Layout::Mxfp4Compressed, "routed experts  12 mxfp4"},
                                                  {Layout::Bf16, "routed experts  12 bf16"}};
  for (const auto& [layout, want] : cases) {
    TinyModel m(layout);
    m.write(dir_ / "ck");
    const Result r = run("inspect " + (dir_ / "ck").string());
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
    EXPECT_NE(r.out.find("problems: none"), std::string::npos) << r.out;
  }
}

TEST_F(InspectTest, ProblemsAreListed) {
  TinyModel m(Layout::ModelOpt);
  for (auto it = m.tensors.begin(); it != m.tensors.end();)  // drop expert 3 entirely
    it = it->first.starts_with("model.layers.1.mlp.experts.3.") ? m.tensors.erase(it) : std::next(it);
  m.tensors.erase("model.layers.1.mlp.experts.1.up_proj.weight_scale_2");
  m.tensors.erase("model.layers.1.mlp.gate.e_score_correction_bias");
  // An FP4 router although the quant config ignores *mlp.gate.
  m.tensors.erase("model.layers.1.mlp.gate.weight");
  m.tensors["model.layers.1.mlp.gate.weight"] = TinyModel::bytes_tensor(DType::U8, {4, 32}, std::vector<uint8_t>(128));
  m.tensors["model.layers.1.mlp.gate.weight_scale"] = TinyModel::bytes_tensor(DType::F8_E4M3, {4, 4}, std::vector<uint8_t>(16, 0x38));
  m.add_f32("model.layers.1.mlp.gate.weight_scale_2", {}, {1.0f});
  const fs::path ck = dir_ / "ck";
  m.write(ck);
  const Result r = run("inspect " + ck.string());
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const char* want : {"problems: 4", "layer 1: 3 of 4 routed experts found",
                           "model.layers.1.mlp.experts.1.up_proj: missing weight_scale_2",
                           "layer 1: topk_method noaux_tc but no model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.gate: is modelopt-nvfp4 but the quant config ignores it"})
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
  EXPECT_EQ(run("inspect --strict " + ck.string()).rc, 1);
  const Result few = run("inspect --max-problems 1 " + ck.string());
  EXPECT_NE(few.out.find("... and 3 more"), std::string::npos) << few.out;
}

TEST_F(InspectTest, ExpertShapeAgainstConfig) {
  TinyModel m(Layout::Bf16);
  m.add_bf16("model.layers.1.mlp.experts.2.down_proj.weight", {TinyModel::H, TinyModel::I / 2});
  m.write(dir_ / "ck");
  const Result r = run("inspect " + (dir_ / "ck").string());
  EXPECT_NE(r.out.find("model.layers.1.mlp.experts.2.down_proj: is [64, 16], the config says [64, 32]"),
            std::string::npos)
      << r.out;
}

TEST_F(InspectTest, CannotOpen) {
  expect_one_line_error(run("inspect " + (dir_ / "missing").string()), "not a directory");
  expect_one_line_error(run("inspect " + dir_.string()), "no config.json");

  TinyModel m(Layout::ModelOpt);
  const fs::path ck = dir_ / "ck";
  m.write(ck, 2);
  const fs::path shard = ck / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  expect_one_line_error(run("inspect " + ck.string()), shard.string() + ": ");

  m.config["architectures"] = {"MixtralForCausalLM"};
  m.write(ck);
  expect_one_line_error(run("inspect " + ck.string()), "unsupported architecture 'MixtralForCausalLM'");

  m = TinyModel(Layout::ModelOpt);
  m.quant["quantization"]["quant_algo"] = "INT4_AWQ";
  m.write(ck);
  expect_one_line_error(run("inspect " + ck.string()), "hf_quant_config.json: ModelOpt quant_algo 'INT4_AWQ'");
}

TEST_F(InspectTest, Usage) {
  EXPECT_EQ(run("inspect --help").rc, 0);
  EXPECT_EQ(run("inspect").rc, 2);
  EXPECT_EQ(run("inspect --bogus x").rc, 2);
}

}  // namespace
}  // namespace fp4moe
