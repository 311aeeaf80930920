// `fp4moe generate --tp / --ep`: values other than 1 are refused in one line (the split
// checked against the model first), and --tp 1 --ep 1 generates exactly what no option does.
#include <string>

#include <gtest/gtest.h>

#include "cli/cli_run_helpers.hpp"
#include "engine/dist/parallel_options.hpp"

using namespace fp4moe::testing_cli;

namespace {

const std::string kModel = std::string(FP4MOE_SOURCE_DIR) + "/tests/model/golden/glm5-tiny-sparse/model";

Result generate(const TempDir& t, const std::string& args) {
  return run_binary(t.path, "generate --model " + kModel + " --prompt-ids 1,2,3 --max-new-tokens 3 " + args);
}

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_TRUE(r.rc == 1 || r.rc == 2) << "rc " << r.rc << "\n" << r.err;
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(GenerateParallelOptions, MoreThanOneRankIsRefusedInOneLine) {
  TempDir t("dist_cli_n");
  expect_one_line_error(generate(t, "--tp 2"), fp4moe::dist::kMultiGpuNotBuilt);
  expect_one_line_error(generate(t, "--ep 4"), fp4moe::dist::kMultiGpuNotBuilt);
  expect_one_line_error(generate(t, "--tp 2 --ep 2"), fp4moe::dist::kMultiGpuNotBuilt);
}

TEST(GenerateParallelOptions, ImpossibleSplitsSayWhy) {
  TempDir t("dist_cli_bad");
  expect_one_line_error(generate(t, "--tp 3"), "4 attention heads are not divisible by 3");
  expect_one_line_error(generate(t, "--ep 17"), "only 16 routed experts");
  expect_one_line_error(generate(t, "--tp 2 --ep 4"), "tp and ep must be equal");
  expect_one_line_error(generate(t, "--tp 0"), "--tp 0");
}

TEST(GenerateParallelOptions, TpOneEpOneIsTheSingleRankPath) {
  TempDir t("dist_cli_one");
  const Result plain = generate(t, "--dump-logits " + (t.path / "plain.safetensors").string());
  const Result one = generate(t, "--tp 1 --ep 1 --dump-logits " + (t.path / "one.safetensors").string());
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_FALSE(plain.out.empty());
  EXPECT_EQ(one.out, plain.out);
  const std::string a = slurp(t.path / "plain.safetensors"), b = slurp(t.path / "one.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the logits differ";
}

}  // namespace
