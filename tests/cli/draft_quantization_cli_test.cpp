// `--speculative-draft-model-quantization` through the real binary on the CPU backend, on
// make-synthetic glm5-tiny (whose MTP layer keeps its routed experts in BF16, as NVIDIA's NVFP4
// checkpoints do): nvfp4 (the default with NEXTN) quantizes them at load and says so in one
// start-up line, unquant keeps them; greedy output is the plain run's either way (the draft only
// proposes; the target verifies); bad values and the flag without speculation are one line and
// a non-zero exit, on generate and serve.
#include <gtest/gtest.h>

#include <string>

#include "cli_run_helpers.hpp"

using namespace fp4moe::testing_cli;

namespace {

const fs::path& tiny(const TempDir& t) {
  static fs::path m;
  m = t.path / "m";
  const Result r = run_binary(t.path, "make-synthetic " + m.string() + " --preset glm5-tiny");
  EXPECT_EQ(r.rc, 0) << r.err;
  return m;
}

Result generate(const TempDir& t, const fs::path& m, const std::string& extra) {
  std::string ids;
  for (int i = 0; i < 24; ++i) ids += (i ? "," : "") + std::to_string((17 + 61 * i) % 1000);
  return run_binary(t.path, "generate --model " + m.string() + " --backend cpu --threads 2 --prompt-ids " + ids +
                                " --max-new-tokens 16 " + extra);
}

TEST(DraftQuantization, QuantizedAndBf16DraftsGiveThePlainGreedyTokens) {
  TempDir t("draft_quant");
  const fs::path m = tiny(t);
  const Result plain = generate(t, m, "");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_FALSE(plain.out.empty());
  EXPECT_EQ(plain.err.find("quantized to NVFP4"), std::string::npos) << plain.err;  // no MTP draft, nothing quantized

  const Result nvfp4 = generate(t, m, "--speculative-algorithm NEXTN --speculative-num-steps 3");
  ASSERT_EQ(nvfp4.rc, 0) << nvfp4.err;
  EXPECT_EQ(nvfp4.out, plain.out);
  EXPECT_NE(nvfp4.err.find("16 BF16 routed experts quantized to NVFP4"), std::string::npos) << nvfp4.err;

  const Result explicit_nvfp4 =
      generate(t, m, "--speculative-algorithm NEXTN --speculative-draft-model-quantization nvfp4");
  ASSERT_EQ(explicit_nvfp4.rc, 0) << explicit_nvfp4.err;
  EXPECT_EQ(explicit_nvfp4.out, plain.out);

  const Result unquant = generate(t, m, "--speculative-algorithm NEXTN --speculative-draft-model-quantization unquant");
  ASSERT_EQ(unquant.rc, 0) << unquant.err;
  EXPECT_EQ(unquant.out, plain.out);
  EXPECT_EQ(unquant.err.find("quantized to NVFP4"), std::string::npos) << unquant.err;
}

TEST(DraftQuantization, BadValuesAndTheFlagWithoutSpeculationAreRefused) {
  TempDir t("draft_quant_bad");
  const fs::path m = tiny(t);
  const Result bad = generate(t, m, "--speculative-algorithm NEXTN --speculative-draft-model-quantization fp8");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--speculative-draft-model-quantization"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
  const Result alone = generate(t, m, "--speculative-draft-model-quantization unquant");
  EXPECT_EQ(alone.rc, 1) << alone.err;
  EXPECT_EQ(alone.err_lines(), 1) << alone.err;
  EXPECT_NE(alone.err.find("needs --speculative-algorithm NEXTN"), std::string::npos) << alone.err;
  EXPECT_EQ(alone.out, "");
  const Result serve = run_binary(t.path, "serve --model " + m.string() +
                                              " --backend cpu --port 1 --speculative-draft-model-quantization nvfp4");
  EXPECT_EQ(serve.rc, 1) << serve.err;
  EXPECT_NE(serve.err.find("needs --speculative-algorithm NEXTN"), std::string::npos) << serve.err;
  for (const std::string cmd : {"generate", "serve", "bench step"}) {
    const Result help = run_binary(t.path, cmd + " --help");
    EXPECT_EQ(help.rc, 0) << cmd;
    EXPECT_NE(help.out.find("--speculative-draft-model-quantization"), std::string::npos) << cmd;
  }
}

}  // namespace
