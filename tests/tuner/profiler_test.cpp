// The profiler on a real GPU (skipped without one): tiny shapes, every runnable tactic is
// measured or dropped with a reason, every tactic's output (the Generic fallback's too) is
// checked row by row against the CPU reference, the ranking is sorted, and the result goes
// through the plan cache into plan_for.
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "gpu_test.hpp"
#include "tuner/plan_cache.hpp"
#include "tuner/profiler.hpp"

using namespace fp4moe;
using namespace fp4moe::tuner;
namespace fs = std::filesystem;

TEST(Profiler, TinyProblemsRankCheckAndPlan) {
  FP4MOE_SKIP_WITHOUT_GPU();
  ASSERT_TRUE(profiler_available());
  const ArchInfo arch = device_arch();
  ProfileOptions opt;
  opt.tokens = {1, 37, 256};
  opt.max_seconds_per_tactic = 0.2;
  std::random_device rd;
  const fs::path path = fs::temp_directory_path() / ("fp4moe_profiler_test_" + std::to_string(rd()) + ".json");
  PlanCache cache(path.string(), current_plan_key());
  for (const GemmProblem& p : preset_problems("tiny")) {
    const ProblemResult r = profile_problem("moe-gemm", p, arch, opt);
    ASSERT_EQ(r.buckets.size(), opt.tokens.size());
    for (const BucketResult& b : r.buckets) {
      EXPECT_EQ(b.m_total, b.tokens * p.top_k);
      ASSERT_NE(b.best(), nullptr) << "nothing ran at " << b.tokens;
      ASSERT_NE(b.of(GemmKernel::Generic), nullptr) << "the fallback must always run (and pass the CPU check)";
      for (size_t i = 1; i < b.ranked.size(); ++i) EXPECT_LE(b.ranked[i - 1].median_us, b.ranked[i].median_us);
      for (const Measurement& m : b.ranked) {
        EXPECT_GE(m.runs, 20) << tactic_name(m.tactic);
        EXPECT_GT(m.median_us, 0);
        EXPECT_GE(m.rel_err, 0) << tactic_name(m.tactic) << " was not checked against the CPU reference";
        EXPECT_LE(m.rel_err, opt.tolerance) << tactic_name(m.tactic);
      }
      for (const Measurement& m : b.dropped) EXPECT_FALSE(m.error.empty()) << tactic_name(m.tactic);
      if (arch.cc == 90) {
        EXPECT_NE(b.of(GemmKernel::Sm90Wgmma), nullptr) << "sm90 kernel did not run at " << b.tokens;
        EXPECT_NE(b.of(GemmKernel::Sm90Decode), nullptr) << "sm90 decode kernel did not run at " << b.tokens;
      }
      PlanEntry e;
      e.n = p.n;
      e.k = p.k;
      e.num_experts = p.num_experts;
      e.weight = p.weight;
      e.act = p.act;
      e.epilogue = p.epilogue;
      e.bucket = b.bucket;
      e.best = b.best()->tactic;
      e.best_us = b.best()->median_us;
      cache.put(e);
    }
    EXPECT_EQ(plan_for(cache, p, 300, arch), r.buckets.back().best()->tactic);
  }
  cache.save();
  PlanCache again(path.string(), current_plan_key());
  EXPECT_TRUE(again.load());
  fs::remove(path);
}
