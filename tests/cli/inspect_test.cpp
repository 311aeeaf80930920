// `fp4moe inspect DIR` end to end: the built binary on synthetic checkpoint folders of
// every layout, a folder with problems, and folders that cannot be opened.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "format/safetensors.hpp"
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
        // TinyModel holds the MoE and dense MLP tensors only: generate would refuse it.
        "model load:   refused", "problems: 1", "  - model load: "})
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
    EXPECT_NE(r.out.find("problems: 1\n  - model load: "), std::string::npos) << r.out;  // no attention tensors
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
  for (const char* want : {"problems: 5", "layer 1: 3 of 4 routed experts found",
                           "model.layers.1.mlp.experts.1.up_proj: missing weight_scale_2",
                           "layer 1: topk_method noaux_tc but no model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.gate: is modelopt-nvfp4 but the quant config ignores it"})
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
  EXPECT_EQ(run("inspect --strict " + ck.string()).rc, 1);
  const Result few = run("inspect --max-problems 1 " + ck.string());
  EXPECT_NE(few.out.find("... and 4 more"), std::string::npos) << few.out;
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

// A loadable model folder (the glm5-tiny-sparse golden model) copied with its tensors edited.
struct Tensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using Tensors = std::map<std::string, Tensor>;

void copy_golden(const fs::path& dst, const std::function<void(Tensors&)>& edit,
                 const std::function<void(nlohmann::json&)>& edit_config = {}) {
  const fs::path src = fs::path(FP4MOE_SOURCE_DIR) / "tests/model/golden/glm5-tiny-sparse/model";
  fs::create_directories(dst);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src / "config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dst / "config.json") << config.dump(2);
  Tensors ts;
  {
    const auto f = SafetensorsFile::open((src / "model.safetensors").string());
    for (const TensorInfo& t : f->tensors()) {
      const auto b = f->bytes(t);
      ts[t.name] = {t.dtype, t.shape, std::vector<uint8_t>(b.begin(), b.end())};
    }
  }
  edit(ts);
  SafetensorsWriter w((dst / "model.safetensors").string());
  for (auto& [name, t] : ts) w.add(name, t.dtype, t.shape, std::span<const uint8_t>(t.bytes));
  w.finish();
}

// inspect --strict runs the binding generate and serve run at load (issue 37, item 6): a folder
// they refuse is a problem, named as they name it.
TEST_F(InspectTest, StrictRefusesWhatGenerateRefuses) {
  copy_golden(dir_ / "ok", [](Tensors&) {});
  const Result ok = run("inspect --strict " + (dir_ / "ok").string());
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("model load:   ok"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("problems: none"), std::string::npos) << ok.out;

  const std::vector<std::pair<std::function<void(Tensors&)>, std::string>> cases = {
      {[](Tensors& ts) { ts.erase("lm_head.weight"); }, "lm_head"},
      // q_a_proj is square in the tiny model ([64, 64]): q_b_proj [192, 64] written as [64, 192].
      {[](Tensors& ts) { ts["model.layers.0.self_attn.q_b_proj.weight"].shape = {64, 192}; },
       "model.layers.0.self_attn.q_b_proj"},
      {[](Tensors& ts) { ts["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"].shape = {64, 80}; },
       "model.layers.1.self_attn.kv_a_proj_with_mqa"},
      {[](Tensors& ts) { ts["model.embed_tokens.weight"].dtype = DType::F16; }, "model.embed_tokens.weight"},
      {[](Tensors& ts) { ts.erase("model.layers.2.self_attn.q_a_layernorm.weight"); }, "q_a_layernorm"},
      {[](Tensors& ts) { ts["model.layers.0.extra.weight"] = ts["model.norm.weight"]; }, "unexpected tensor"},
  };
  int i = 0;
  for (const auto& [edit, needle] : cases) {
    const fs::path ck = dir_ / ("bad" + std::to_string(i++));
    copy_golden(ck, edit);
    const Result r = run("inspect --strict " + ck.string());
    EXPECT_EQ(r.rc, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("model load:   refused"), std::string::npos) << r.out;
    const size_t at = r.out.find("  - model load: ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(line.find(needle), std::string::npos) << "expected '" << needle << "' in: " << line;
    // generate refuses it with the same words.
    const Result g = run("generate --model " + ck.string() + " --prompt-ids 1,2,3 --max-new-tokens 1");
    EXPECT_NE(g.rc, 0) << g.out;
    EXPECT_NE(g.err.find(needle), std::string::npos) << g.err;
  }
  // A config value out of range is a load problem too.
  copy_golden(dir_ / "cfg", [](Tensors&) {}, [](nlohmann::json& c) { c["index_topk"] = int64_t(1) << 40; });
  const Result cfg = run("inspect --strict " + (dir_ / "cfg").string());
  EXPECT_EQ(cfg.rc, 1) << cfg.out;
  EXPECT_NE((cfg.out + cfg.err).find("'index_topk'"), std::string::npos) << cfg.out << cfg.err;
}

// The ignore patterns go through the one bounded matcher (issue 37, item 6): the probe's
// pattern, which hung inspect CPU-bound, is answered at once, and one that defeats PCRE2's
// shortcuts ends in a problem naming it within a time bound, not a hang.
TEST_F(InspectTest, CatastrophicIgnorePatternIsBounded) {
  TinyModel m(Layout::ModelOpt);
  m.quant["quantization"]["exclude_modules"] = {"lm_head", "re:(.|.)*X", "*mlp.gate"};
  m.write(dir_ / "ck");
  auto t0 = std::chrono::steady_clock::now();
  const Result probe = run("inspect " + (dir_ / "ck").string());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(probe.rc, 0) << probe.err;
  EXPECT_EQ(probe.out.find("too costly"), std::string::npos) << probe.out;
  m.quant["quantization"]["exclude_modules"] = {"lm_head", "re:(.|.)*ss$", "*mlp.gate"};
  m.write(dir_ / "ck");
  t0 = std::chrono::steady_clock::now();
  const Result r = run("inspect --strict " + (dir_ / "ck").string());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("'re:(.|.)*ss$' is too costly to match"), std::string::npos) << r.out << r.err;
  // A plain regex still matches from the start of the name (Python's re.match).
  m.quant["quantization"]["exclude_modules"] = {"lm_head", "re:model\\.layers\\.\\d+\\.mlp\\.gate$"};
  m.write(dir_ / "ck");
  const Result ok = run("inspect " + (dir_ / "ck").string());
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(ok.out.find("too costly"), std::string::npos) << ok.out;
  m.quant["quantization"]["exclude_modules"] = {"re:(unclosed"};
  m.write(dir_ / "ck");
  expect_one_line_error(run("inspect " + (dir_ / "ck").string()), "is not a valid regex");
}

// Checkpoint files that are not regular files are refused before open() (issue 37, item 7).
TEST_F(InspectTest, NonRegularFilesAreRefusedWithoutBlocking) {
  TinyModel m(Layout::ModelOpt);
  const fs::path ck = dir_ / "ck";
  m.write(ck);
  fs::remove(ck / "model.safetensors");
  ASSERT_EQ(::mkfifo((ck / "model.safetensors").c_str(), 0600), 0);
  expect_one_line_error(run("inspect " + ck.string()), "model.safetensors: not a regular file (a FIFO)");
  fs::remove(ck / "config.json");
  ASSERT_EQ(::mkfifo((ck / "config.json").c_str(), 0600), 0);
  expect_one_line_error(run("inspect " + ck.string()), "config.json: not a regular file (a FIFO)");
}

TEST_F(InspectTest, Usage) {
  EXPECT_EQ(run("inspect --help").rc, 0);
  EXPECT_EQ(run("inspect").rc, 2);
  EXPECT_EQ(run("inspect --bogus x").rc, 2);
}

}  // namespace
}  // namespace fp4moe
