// `fp4moe tune --dry-run` for sm_120 / sm_100 (no GPU needed): the report names the rejected tiles
// with their bytes (from the CUTLASS types), prints the whole-model plan, and bad input is one
// clear line with a non-zero exit.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tuner/sm1xx_tactics.hpp"
#include "tuner/tune_report.hpp"
#include "tuner/sm1xx_build.hpp"

using namespace fp4moe::tuner;
namespace fs = std::filesystem;

namespace {

struct RunResult {
  int rc = -1;
  std::string out;
};

RunResult run(const std::string& args) {
  const std::string cmd = std::string(FP4MOE_BINARY_DIR "/bin/fp4moe ") + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool have_binary() { return fs::exists(FP4MOE_BINARY_DIR "/bin/fp4moe"); }

}  // namespace

TEST(TuneReport, DryRunForSm120NamesTheTilesAndTheBytes) {
  if (!sm1xx_facts_available()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_TRUE(sm1xx_facts_available()) << "built for Blackwell but: " << sm1xx_absence_reason();
  const ArchInfo& a = arch_by_name("sm_120");
  std::vector<ProblemFeasibility> all;
  for (const GemmProblem& p : preset_problems("glm5", ActFormat::NVFP4_EMULATED)) all.push_back(check_feasibility("moe-gemm", p, a));
  const std::string text = format_feasibility("moe-gemm", all, a, false);
  EXPECT_NE(text.find("sm120-mma-bs 128x256x256 s2"), std::string::npos) << text;
  EXPECT_NE(text.find("needs 121,856 B of shared memory (sizeof(SharedStorage) of its CUTLASS types); sm_120 allows "
                      "101,376 B per block"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("needs wgmma (sm_90a); sm_120 has none"), std::string::npos);
  EXPECT_NE(text.find("sizeof(CollectiveMainloop::TensorStorage)"), std::string::npos);  // term by term
  EXPECT_NE(text.find("compiled, not run"), std::string::npos);
  const std::string verdict = feasibility_verdict("moe-gemm", all, a);
  EXPECT_NE(verdict.find("128x256x256, 256x128x256 (do not fit 101,376 B of shared memory even at 2 stages)"),
            std::string::npos)
      << verdict;
  EXPECT_NE(verdict.find("generic"), std::string::npos);
}

TEST(TuneCli, DryRunSm120WritesReportPlanAndJson) {
  ASSERT_TRUE(have_binary()) << FP4MOE_BINARY_DIR "/bin/fp4moe not built (ctest runs after the full build)";
  if (!sm1xx_facts_available()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_TRUE(sm1xx_facts_available()) << "built for Blackwell but: " << sm1xx_absence_reason();
  const fs::path json = fs::temp_directory_path() / "fp4moe_tune_cli_test.json";
  const RunResult r = run("tune --preset glm5 --arch sm_120 --dry-run --act w4a4 --json " + json.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("sm_120"), std::string::npos);
  EXPECT_NE(r.out.find("101,376 B per block"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("121,856 B"), std::string::npos);
  EXPECT_NE(r.out.find("verdict:"), std::string::npos);
  EXPECT_NE(r.out.find("whole-model plan on sm_120"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-> sm120-mma-bs 128x32x256"), std::string::npos) << r.out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("arch").at("name"), "sm_120");
  EXPECT_EQ(j.at("feasibility").size(), 2u);
  EXPECT_TRUE(j.at("dry_run").get<bool>());
  EXPECT_GE(j.at("model_plan").at("entries").size(), 8u);
  bool found = false;
  for (const auto& t : j.at("feasibility")[0].at("tactics"))
    if (t.at("tactic") == "sm120-mma-bs 128x256x128 s3") {
      found = true;
      EXPECT_FALSE(t.at("ok").get<bool>());  // it fits, but no kernel of that tile is built
      EXPECT_EQ(t.at("reasons")[0].at("kind"), "not built");
      EXPECT_EQ(t.at("smem").at("total").get<int64_t>(), 94208);
    }
  EXPECT_TRUE(found);
  fs::remove(json);
}

TEST(TuneCli, DryRunSm100PrintsTheWholeModelPlan) {
  ASSERT_TRUE(have_binary()) << FP4MOE_BINARY_DIR "/bin/fp4moe not built (ctest runs after the full build)";
  const RunResult r = run("tune --preset glm5 --arch sm_100 --dry-run --tokens 1,8192");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("whole-model plan on sm_100"), std::string::npos) << r.out;
  for (const char* part : {"routed experts gate_up (N 4096, K 6144), T=1", "routed experts down (N 6144, K 2048), T=8192",
                           "router", "DSA indexer (32 x 128, top-2048)", "lm_head"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  // Attention: the sm_100a kernels' lines where the build has them, else the line saying none is compiled.
  const bool sm100_built = r.out.find("none compiled for sm_100") == std::string::npos;
  for (const char* part : sm100_built ? std::vector<const char*>{"MLA decode", "MLA prefill"}
                                      : std::vector<const char*>{"MLA attention"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  if (sm1xx_facts_available()) {
    EXPECT_NE(r.out.find("-> sm100-moe-bs 128x64x256"), std::string::npos) << r.out;
  }
}

TEST(TuneCli, EveryTableArchitectureDryRuns) {
  ASSERT_TRUE(have_binary()) << FP4MOE_BINARY_DIR "/bin/fp4moe not built (ctest runs after the full build)";
  for (const ArchInfo& a : arch_table()) {
    const RunResult r = run("tune --preset tiny --arch " + a.name + " --dry-run");
    EXPECT_EQ(r.rc, 0) << a.name << "\n" << r.out;
    EXPECT_NE(r.out.find("verdict:"), std::string::npos) << a.name;
  }
}

TEST(TuneCli, BadInputIsOneClearLine) {
  ASSERT_TRUE(have_binary()) << FP4MOE_BINARY_DIR "/bin/fp4moe not built (ctest runs after the full build)";
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {Case{"tune --arch sm_77 --dry-run", "unknown architecture 'sm_77'"},
                        Case{"tune --op attention --arch sm_90 --dry-run", "unknown op 'attention'"},
                        Case{"tune --preset glm6 --arch sm_90 --dry-run", "unknown preset 'glm6'"},
                        Case{"tune --act w4a8 --arch sm_90 --dry-run", "--act: 'w4a8'"},
                        Case{"tune --model /nonexistent/dir --arch sm_90 --dry-run", "/nonexistent/dir"},
                        Case{"tune --preset glm5 --model x --arch sm_90 --dry-run", "exclude each other"}}) {
    const RunResult r = run(c.args);
    EXPECT_EQ(r.rc, 1) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST(TuneCli, ModelShapesComeFromTheCheckpointConfig) {
  ASSERT_TRUE(have_binary()) << FP4MOE_BINARY_DIR "/bin/fp4moe not built (ctest runs after the full build)";
  const fs::path dir = fs::temp_directory_path() / "fp4moe_tune_cli_model";
  fs::remove_all(dir);
  const RunResult made = run("make-synthetic --preset glm5-tiny " + dir.string());
  ASSERT_EQ(made.rc, 0) << "make-synthetic failed:\n" << made.out;
  const RunResult r = run("tune --model " + dir.string() + " --arch sm_90 --dry-run");
  EXPECT_EQ(r.rc, 0) << r.out;
  // glm5-tiny: H=256, I=128, E=16, top-4 -> gate_up N=256 K=256, down N=256 K=128.
  EXPECT_NE(r.out.find("gate_up N=256 K=256 E=16 top-4 nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("down N=256 K=128 E=16 top-4 nvfp4"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

namespace {
Measurement measured(GemmKernel impl, int bn, double us) {
  Measurement m;
  m.tactic = impl == GemmKernel::Sm90Wgmma ? Tactic{impl, 128, bn, 64, 4, 1, 1} : Tactic{impl};
  m.median_us = us;
  m.runs = 20;
  return m;
}
}  // namespace

TEST(TuneReport, MeasuredVerdictInPlainWords) {
  ProblemResult pr;
  pr.problem = preset_problems("glm5")[0];
  for (auto [tokens, ours, cublas] : {std::tuple{1, 30.0, 93.0}, std::tuple{8192, 5000.0, 9000.0}}) {
    BucketResult b;
    b.tokens = b.bucket = tokens;
    b.ranked = {measured(GemmKernel::Sm90Wgmma, 16, ours), measured(GemmKernel::DequantCublas, 0, cublas),
                measured(GemmKernel::Generic, 0, cublas * 2)};
    Measurement bad = measured(GemmKernel::Sm90Wgmma, 256, 1);
    bad.status = Measurement::Status::Disqualified;
    bad.error = "output differs from the reference (generic): rel err 0.5 > 1e-02";
    b.dropped = {bad};
    pr.buckets.push_back(b);
  }
  const std::string v = measured_verdict("moe-gemm", {pr});
  EXPECT_NE(v.find("sm90-wgmma 128x16x64 s4 is fastest at every bucket"), std::string::npos) << v;
  EXPECT_NE(v.find("no grouped path) is 1.80-3.10x slower"), std::string::npos) << v;
  EXPECT_NE(v.find("the current path is the best one"), std::string::npos) << v;
  const std::string table = format_measured({pr});
  EXPECT_NE(table.find("disqualified"), std::string::npos) << table;
  EXPECT_NE(table.find("rel err 0.5"), std::string::npos);
  // The baseline winning somewhere is said as plainly.
  std::swap(pr.buckets[0].ranked[0], pr.buckets[0].ranked[1]);
  pr.buckets[0].ranked[0].median_us = 10;
  const std::string v2 = measured_verdict("moe-gemm", {pr});
  EXPECT_NE(v2.find("dequant-cublas wins 1 of 2"), std::string::npos) << v2;
  EXPECT_NE(v2.find("beats our kernels"), std::string::npos) << v2;
}
