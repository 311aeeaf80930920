// `fp4moe run-moe` end to end: make-synthetic glm5-tiny -> run-moe (the built binary) ->
// compare with moe_forward_cpu run in-process on the same layer; every bad input gives
// exit code 1 or 2 with a one-line message.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "core/bf16.hpp"
#include "cpu/moe_cpu.hpp"
#include "format/checkpoint.hpp"
#include "format/safetensors.hpp"

namespace fp4moe {
namespace {

using namespace testing_cli;

constexpr int64_t kHidden = 256;  // glm5-tiny

class RunMoeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("runmoe_suite");
    model_ = dir_->path / "model";
    const Result r = run_binary(dir_->path, "make-synthetic " + model_.string() + " --preset glm5-tiny --seed 11");
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::vector<float> random_x(int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(T * kHidden));
    for (auto& v : x) v = nd(rng);
    return x;
  }
  static void write_f32(const fs::path& p, const std::string& name, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
    SafetensorsWriter w(p.string());
    w.add(name, DType::F32, std::move(shape), v);
    w.finish();
  }

  Result run_moe(const std::string& args) { return run_binary(dir_->path, "run-moe " + args); }
  std::string std_args(const fs::path& in, int64_t layer = 1) const {
    return "--model " + model_.string() + " --layer " + std::to_string(layer) + " --input " + in.string() +
           " --output " + (dir_->path / "out.safetensors").string();
  }

  static TempDir* dir_;
  static fs::path model_;
};
TempDir* RunMoeTest::dir_ = nullptr;
fs::path RunMoeTest::model_;

void expect_matches_in_process(const fs::path& model, int64_t layer, const std::vector<float>& x, int64_t T,
                               const fs::path& out_file) {
  const auto ck = Checkpoint::open(model.string());
  const MoeLayerWeights w = ck->load_moe_layer(layer);
  const MoeOutput ref = moe_forward_cpu(w, x.data(), T);
  const auto f = SafetensorsFile::open(out_file.string());
  const TensorInfo& o = f->get("output");
  const TensorInfo& ids = f->get("topk_ids");
  const TensorInfo& wts = f->get("topk_weights");
  ASSERT_EQ(o.dtype, DType::F32);
  ASSERT_EQ(o.shape, (std::vector<int64_t>{T, kHidden}));
  ASSERT_EQ(ids.dtype, DType::I32);
  ASSERT_EQ(ids.shape, (std::vector<int64_t>{T, w.cfg.top_k}));
  ASSERT_EQ(wts.dtype, DType::F32);
  ASSERT_EQ(wts.shape, (std::vector<int64_t>{T, w.cfg.top_k}));
  std::vector<float> out(ref.out.size()), tw(ref.routing.topk_weights.size());
  std::vector<int32_t> ti(ref.routing.topk_ids.size());
  std::memcpy(out.data(), f->bytes(o).data(), out.size() * 4);
  std::memcpy(ti.data(), f->bytes(ids).data(), ti.size() * 4);
  std::memcpy(tw.data(), f->bytes(wts).data(), tw.size() * 4);
  // Same code, and the CPU layer is bitwise deterministic for any thread count: exact.
  EXPECT_EQ(out, ref.out);
  EXPECT_EQ(ti, ref.routing.topk_ids);
  EXPECT_EQ(tw, ref.routing.topk_weights);
  double n = 0;
  for (float v : out) n += double(v) * v;
  EXPECT_GT(n, 0.0);  // a real, non-zero output
}

TEST_F(RunMoeTest, MatchesInProcessCpuLayerF32AndBf16Inputs) {
  const int64_t T = 37;
  const std::vector<float> x = random_x(T, 1);
  const fs::path in = dir_->path / "in_f32.safetensors";
  write_f32(in, "hidden_states", {T, kHidden}, x);
  for (int64_t layer : {1, 2}) {
    const Result r = run_moe(std_args(in, layer) + " --threads 1");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("T=37"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
    expect_matches_in_process(model_, layer, x, T, dir_->path / "out.safetensors");
  }
  // BF16 input: the values the layer sees are the BF16 ones.
  std::vector<uint16_t> h(x.size());
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = float_to_bf16(x[i]);
    xr[i] = bf16_to_float(h[i]);
  }
  const fs::path in16 = dir_->path / "in_bf16.safetensors";
  {
    SafetensorsWriter w(in16.string());
    w.add("hidden_states", DType::BF16, {T, kHidden}, h);
    w.finish();
  }
  ASSERT_EQ(run_moe(std_args(in16)).rc, 0);
  expect_matches_in_process(model_, 1, xr, T, dir_->path / "out.safetensors");
  // The sample input make-synthetic writes works as is.
  ASSERT_EQ(run_moe(std_args(model_ / "sample_input.safetensors")).rc, 0);
}

TEST_F(RunMoeTest, BadInputsGiveExitCodeAndOneLine) {
  const fs::path d = dir_->path;
  const fs::path good = d / "good.safetensors";
  write_f32(good, "hidden_states", {2, kHidden}, random_x(2, 2));
  write_f32(d / "noname.safetensors", "x", {2, kHidden}, random_x(2, 3));
  write_f32(d / "wrong_hidden.safetensors", "hidden_states", {2, 128}, std::vector<float>(256, 0.5f));
  write_f32(d / "three_d.safetensors", "hidden_states", {1, 2, kHidden}, random_x(2, 4));
  write_f32(d / "zero_t.safetensors", "hidden_states", {0, kHidden}, {});
  std::vector<float> nan_x = random_x(2, 5);
  nan_x[300] = std::nanf("");
  write_f32(d / "nan.safetensors", "hidden_states", {2, kHidden}, nan_x);
  {
    SafetensorsWriter w((d / "i32.safetensors").string());
    w.add("hidden_states", DType::I32, {2, kHidden}, std::vector<int32_t>(2 * kHidden, 1));
    w.finish();
    std::ofstream(d / "garbage.safetensors") << "this is not a safetensors file";
  }
  // A copy of the model whose router weight holds a NaN (non-finite weights).
  const fs::path bad_model = d / "nan_model";
  fs::create_directories(bad_model);
  for (const char* f : {"config.json", "hf_quant_config.json"}) fs::copy_file(model_ / f, bad_model / f);
  {
    const auto src = SafetensorsFile::open((model_ / "model.safetensors").string());
    SafetensorsWriter w((bad_model / "model.safetensors").string());
    for (const TensorInfo& t : src->tensors()) {
      std::vector<uint8_t> bytes(src->bytes(t).begin(), src->bytes(t).end());
      if (t.name == "model.layers.1.mlp.gate.weight") bytes[10] = 0xC0, bytes[11] = 0x7F;  // bf16 NaN
      w.add(t.name, t.dtype, t.shape, bytes);
    }
    w.finish();
  }
  const std::string out = " --output " + (d / "o.safetensors").string();
  auto args = [&](const fs::path& model, int64_t layer, const fs::path& in) {
    return "--model " + model.string() + " --layer " + std::to_string(layer) + " --input " + in.string() + out;
  };
  struct Case {
    std::string args, expect;  // expect: a piece of the message (rc 1 cases)
    int rc;
  };
  const std::vector<Case> cases = {
      {args(d / "no_such_model", 1, good), "no such model directory", 1},
      {args(model_, 1, d / "missing.safetensors"), "no such input file", 1},
      {args(model_, 1, d / "garbage.safetensors"), "garbage.safetensors", 1},
      {args(model_, 1, d / "noname.safetensors"), "hidden_states", 1},
      {args(model_, 1, d / "wrong_hidden.safetensors"), "hidden size", 1},
      {args(model_, 1, d / "three_d.safetensors"), "dimensions", 1},
      {args(model_, 1, d / "zero_t.safetensors"), "T = 0", 1},
      {args(model_, 1, d / "i32.safetensors"), "dtype I32", 1},
      {args(model_, 1, d / "nan.safetensors"), "not finite", 1},
      {args(model_, 3, good), "out of range", 1},
      {args(model_, -1, good), "out of range", 1},
      {args(model_, 0, good), "dense", 1},
      {args(bad_model, 1, good), "non-finite", 1},
      {args(model_, 1, good) + " --backend cuda", "cuda backend", 1},
      {"--model " + model_.string() + " --layer 1 --input " + good.string() + " --output " +
           (d / "no_dir" / "o.safetensors").string(),
       "no_dir", 1},
      {args(model_, 1, good) + " --backend tpu", "", 2},
      {args(model_, 1, good) + " --threads -2", "", 1},
      {"--model " + model_.string() + " --layer 1 --input " + good.string(), "", 2},  // no --output
      {"--model " + model_.string() + " --layer one --input " + good.string() + out, "", 2},
  };
  for (const Case& c : cases) {
    const Result r = run_moe(c.args);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << c.args;
    if (c.rc == 1) {
      EXPECT_EQ(r.err_lines(), 1) << c.args << "\n" << r.err;
      EXPECT_EQ(r.err.rfind("fp4moe: ", 0), 0u) << r.err;
      EXPECT_NE(r.err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << r.err;
    }
  }
  // The good input still works after all that.
  EXPECT_EQ(run_moe(args(model_, 1, good)).rc, 0);
}

}  // namespace
}  // namespace fp4moe
