// The CPU backend against transformers 5.17 (FP32, on the same BF16 or dequantized NVFP4
// weights): every golden case × weight variant, 64 prompt tokens + 32 greedy steps.
//
// The bound (kRelL2): both sides run FP32 arithmetic on the same weights (BF16 and dequantized
// NVFP4 values are exact in FP32; activations stay FP32 on both sides), so they differ only by
// rounding: the order of summation in dot products (hidden 64, K <= 128: ~sqrt(K) * 2^-24 =
// 7e-7 relative per product) and the libm / our exp, rsqrt, sin / cos, compounded through ~10
// sequential operations per layer over 3-4 layers: ~sqrt(40) * 7e-7 = 4e-6. Measured at
// e7ea5a5 (x86-64, g++ 12, -O3): worst logits row 1.49e-6 (glm5-tiny-sparse nvfp4; all 12
// cases 0.96e-6 .. 1.49e-6), worst hidden state 7.4e-7 (deepseek-v3-tiny-yarn bf16, layer 3).
// 1e-5 is a few times the derived noise and ~7x the measured worst; a real defect (a wrong
// RMSNorm eps, a rope or mask slip, a misrouted expert) moves rows by 1e-5 .. 1e-1.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "model/model.hpp"
#include "model_test_util.hpp"
#include "sequence_forward.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_model;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;     // golden folder
  std::string variant;  // "bf16", "nvfp4" (NVIDIA layout, routed experts W4A4), "nvfp4_all" (`fp4moe quantize`)
};

std::string golden_file(const Case& c) {
  return golden_dir(c.name) + (c.variant == "bf16" ? "/golden.safetensors" : "/golden_" + c.variant + ".safetensors");
}

// The model folder of a case: the committed BF16 one, or its quantized copy (made once per
// process with the same command as the golden, tools/oracle/README.md).
std::string model_dir(const Case& c) {
  if (c.variant == "bf16") return golden_dir(c.name) + "/model";
  static std::map<std::string, std::string> made;
  static testing_cli::TempDir tmp("golden_models");
  const std::string key = c.name + "_" + c.variant;
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const fs::path out = tmp.path / key;
  const std::string extra = c.variant == "nvfp4" ? " --only '*.mlp.experts.*' --input-amax 8" : "";
  const auto r = testing_cli::run_binary(tmp.path, "quantize " + golden_dir(c.name) + "/model " + out.string() + extra);
  EXPECT_EQ(r.rc, 0) << r.err;
  return made[key] = out.string();
}

class GoldenTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    golden_ = SafetensorsFile::open(golden_file(GetParam()));
    tokens_ = read_tensor<int32_t>(*golden_, "tokens");
    logits_ = read_tensor<float>(*golden_, "logits", &logits_shape_);
    vocab_ = logits_shape_[1];
    model::ModelOptions o;
    o.threads = 2;
    model_ = model::Model::load(model_dir(GetParam()), o);
  }
  std::vector<int32_t> prompt() const { return {tokens_.begin(), tokens_.begin() + kPrompt}; }

  static constexpr int64_t kPrompt = 64, kNew = 32;
  static constexpr double kRelL2 = 1e-5;  // see the top of the file
  std::unique_ptr<SafetensorsFile> golden_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  std::vector<int64_t> logits_shape_;
  int64_t vocab_ = 0;
  std::unique_ptr<model::Model> model_;
};

}  // namespace

TEST_P(GoldenTest, LogitsOfEveryPromptAndDecodeRowWithin1em5AndArgmaxWhereMarginAbove1em3) {
  ASSERT_EQ(int64_t(tokens_.size()), kPrompt + kNew);
  ASSERT_EQ(logits_shape_[0], kPrompt + kNew - 1);
  // The prompt in one prefill step, then the golden continuation one decode step per token.
  const std::vector<int32_t> seq(tokens_.begin(), tokens_.end() - 1);
  const SequenceForward r = forward_sequence(*model_, seq, kPrompt);
  ASSERT_EQ(r.logits.size(), logits_.size());
  double worst = 0;
  for (int64_t i = 0; i < kPrompt + kNew - 1; ++i) {
    const float* got = r.logits.data() + i * vocab_;
    const float* ref = logits_.data() + i * vocab_;
    const double e = rel_l2(got, ref, size_t(vocab_));
    worst = std::max(worst, e);
    EXPECT_LE(e, kRelL2) << "row " << i;
    if (top2_margin(ref, vocab_) > 1e-3f) {
      EXPECT_EQ(argmax(got, vocab_), argmax(ref, vocab_)) << "row " << i;
    }
  }
  RecordProperty("worst_row_rel_l2", std::to_string(worst));
}

TEST_P(GoldenTest, FreeRunningGreedyTokensEqualGoldenUpToTheFirstNearTie) {
  // `fp4moe generate`'s path: the engine, the CPU backend, greedy sampling.
  EngineGenerateOptions g;
  g.max_new_tokens = kNew;
  const engine::OneRequestResult r = generate_on_engine(model_dir(GetParam()), prompt(), g).result;
  ASSERT_EQ(int64_t(r.tokens.size()), kPrompt + kNew);
  for (int64_t i = kPrompt; i < kPrompt + kNew; ++i) {
    if (top2_margin(logits_.data() + (i - 1) * vocab_, vocab_) <= 1e-3f) break;  // row i-1 chose token i
    ASSERT_EQ(r.tokens[size_t(i)], tokens_[size_t(i)]) << "token " << i;
  }
}

TEST_P(GoldenTest, PerLayerHiddenStatesOfThePromptWithin1em5) {
  ForwardOptions o;
  o.hidden = true;
  const model::HiddenStates hidden = forward_sequence(*model_, prompt(), kPrompt, o).hidden;
  const int64_t L = model_->config().num_layers, H = model_->config().hidden;
  ASSERT_EQ(int64_t(hidden.size()), L + 1);
  for (int64_t i = 0; i <= L; ++i) {
    const auto ref = read_tensor<float>(*golden_, "hidden_states." + std::to_string(i));
    ASSERT_EQ(ref.size(), size_t(kPrompt * H));
    EXPECT_LE(rel_l2(hidden[size_t(i)].data(), ref.data(), ref.size()), kRelL2) << "hidden_states." << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTest,
                         ::testing::ValuesIn([] {
                           std::vector<Case> v;
                           for (const char* n : {"glm5-tiny-sparse", "glm5-tiny-dense", "glm5-tiny-shared",
                                                 "deepseek-v3-tiny-yarn"})
                             for (const char* var : {"bf16", "nvfp4", "nvfp4_all"}) v.push_back({n, var});
                           return v;
                         }()),
                         [](const auto& info) {
                           std::string s = info.param.name + "_" + info.param.variant;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });
