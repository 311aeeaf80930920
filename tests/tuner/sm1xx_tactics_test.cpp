// The Blackwell tactics judged with what their CUTLASS types say (cuda/moe_gemm_sm1xx facts:
// sizeof(GemmKernel::SharedStorage), the stage count the builder resolved), against the arch
// model; and the whole-model plan by arch. Compiled, not run: nothing here launches a kernel.
// The facts exist only in a CUDA build with sm_100a / sm_120a (CI's default); elsewhere skipped.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "tuner/arch.hpp"
#include "tuner/model_plan.hpp"
#include "tuner/sm1xx_tactics.hpp"
#include "tuner/tactic.hpp"
#include "tuner/tune_report.hpp"
#include "tuner/sm1xx_build.hpp"

#ifdef FP4MOE_HAVE_CUDA
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"
#endif

using namespace fp4moe;
using namespace fp4moe::tuner;

#define SKIP_WITHOUT_FACTS(cc)                                                                   \
  do {                                                                                          \
    if (!have_facts(cc)) FP4MOE_SKIP_UNLESS_BUILT_FOR(cc);                                      \
    ASSERT_TRUE(have_facts(cc)) << "built for sm_" << cc << "a but its CUTLASS facts are missing";  \
  } while (0)

namespace {

#ifdef FP4MOE_HAVE_CUDA
namespace bs = cuda::sm1xx;

const bs::BsKernelFacts* facts(bs::BsRecipe r, int m, int n, int k, int stages, bool auto_stages, bool f32 = false) {
  for (const bs::BsKernelFacts& f : bs::bs_type_facts())
    if (f.recipe == r && f.tile_m == m && f.tile_n == n && f.tile_k == k && f.f32_source == f32 &&
        f.auto_stages == auto_stages && (stages == 0 || f.stages == stages))
      return &f;
  return nullptr;
}

bool have_facts(int cc) {
  for (const bs::BsKernelFacts& f : bs::bs_type_facts())
    if (bs::recipe_cc(f.recipe) == cc) return true;
  return false;
}
#else
bool have_facts(int) { return false; }
#endif

}  // namespace

#ifdef FP4MOE_HAVE_CUDA

// The seed's finding, reconciled with CUTLASS's own types (FlashInfer 0.7.2.post1's CUTLASS 4.5):
// the hand-written model said 128x256 / 256x128 at K = 128 need 102,400 B at 3 stages (over
// sm_120's 101,376 B) and that StageCountAutoCarveout overshoots. The types say: beside our
// epilogue (BF16 D, no C source) 3 stages need 94,208 B and fit; they stop fitting beside an
// epilogue that also loads an FP32 C (110,592 B), where the auto count already picks 2; at
// K = 256 even 2 stages need 121,856 B, beside any epilogue.
TEST(Sm1xxFacts, Sm120WideTilesFitAtK128BesideABf16EpilogueButNotBesideAnF32SourceOrAtK256) {
  SKIP_WITHOUT_FACTS(120);
  const int64_t cap = arch_by_name("sm_120").smem_per_block_optin;
  ASSERT_EQ(cap, 101376);
  using R = bs::BsRecipe;
  for (auto [m, n] : {std::pair{128, 256}, std::pair{256, 128}}) {
    const auto* s3 = facts(R::Sm120Grouped, m, n, 128, 3, false);
    const auto* s2 = facts(R::Sm120Grouped, m, n, 128, 2, false);
    const auto* aut = facts(R::Sm120Grouped, m, n, 128, 0, true);
    const auto* f32_s3 = facts(R::Sm120Grouped, m, n, 128, 3, false, true);
    const auto* k256 = facts(R::Sm120Grouped, m, n, 256, 2, false);
    ASSERT_TRUE(s3 && s2 && aut && f32_s3 && k256) << m << "x" << n;
    EXPECT_EQ(s3->smem_bytes, 94208) << m << "x" << n;
    EXPECT_LE(s3->smem_bytes, cap);
    EXPECT_EQ(s2->smem_bytes, 66560);
    EXPECT_EQ(aut->stages, 3);  // the auto count picks 3, and 3 fit
    EXPECT_EQ(aut->smem_bytes, s3->smem_bytes);
    // Per stage: A 128 x 64 B + B 256 x 64 B + SFA 128 x 8 + SFB 256 x 8 = 27,648 B.
    EXPECT_EQ(s3->mainloop_bytes, 3 * 27648);
    EXPECT_EQ(s3->mainloop_bytes - s2->mainloop_bytes, 27648);
    EXPECT_EQ(f32_s3->smem_bytes, 110592);
    EXPECT_GT(f32_s3->smem_bytes, cap);  // the FP32 C staging (26,624 B of epilogue) tips it over
    EXPECT_GT(f32_s3->epilogue_bytes, s3->epilogue_bytes);
    EXPECT_EQ(k256->smem_bytes, 121856);
    EXPECT_GT(k256->smem_bytes, cap);  // two stages of 55,296 B: no stage count fits
  }
  const auto* f32_auto = facts(R::Sm120Grouped, 128, 256, 128, 0, true, true);
  ASSERT_NE(f32_auto, nullptr);
  EXPECT_EQ(f32_auto->stages, 2);
  EXPECT_LE(f32_auto->smem_bytes, cap);
}

// The arch model agrees with the builders' capacity constants, and no auto stage count
// overshoots it (CUTLASS reserves the epilogue's whole SharedStorage and the kernel's extras).
TEST(Sm1xxFacts, AutoStageCountsFitTheArchModelAndTheBuildersAgreeWithIt) {
  if (!have_facts(120) && !have_facts(100)) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_TRUE(have_facts(120) || have_facts(100)) << "built for Blackwell but no CUTLASS facts";
  for (const bs::BsKernelFacts& f : bs::bs_type_facts()) {
    const ArchInfo& a = arch_by_name(bs::recipe_cc(f.recipe) == 120 ? "sm_120" : "sm_100");
    EXPECT_EQ(f.builder_capacity, a.smem_per_block_optin) << f.name();
    EXPECT_GE(f.stages, 2) << f.name();
    EXPECT_GT(f.mainloop_bytes, 0) << f.name();
    EXPECT_LE(f.mainloop_bytes + f.epilogue_bytes, f.smem_bytes) << f.name();
    EXPECT_LE(f.epilogue_bytes, f.epilogue_carveout) << f.name();
    EXPECT_LE(f.threads, a.max_threads_per_block) << f.name();
    if (f.auto_stages) {
      EXPECT_LE(f.smem_bytes, a.smem_per_block_optin) << f.name();
    }
  }
}

// Each instantiated kernel's own facts are a row of the table (the same types).
TEST(Sm1xxFacts, EveryBuiltKernelIsARowOfTheFactsTable) {
  if (bs::bs_kernels().empty()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_FALSE(bs::bs_kernels().empty()) << "built for Blackwell but no kernel is registered";
  for (const bs::BsKernel& k : bs::bs_kernels()) {
    const auto* f = facts(k.facts.recipe, k.facts.tile_m, k.facts.tile_n, k.facts.tile_k, k.facts.stages, true);
    ASSERT_NE(f, nullptr) << k.facts.name();
    EXPECT_EQ(f->smem_bytes, k.facts.smem_bytes) << k.facts.name();
    EXPECT_EQ(f->mainloop_bytes, k.facts.mainloop_bytes) << k.facts.name();
    EXPECT_EQ(f->threads, k.facts.threads) << k.facts.name();
  }
}

#endif  // FP4MOE_HAVE_CUDA

// Through the registry: the verdicts carry the types' bytes.
TEST(Sm1xxTactics, Sm120VerdictsComeFromTheInstantiatedTypes) {
  SKIP_WITHOUT_FACTS(120);
  const ArchInfo& a = arch_by_name("sm_120");
  const GemmProblem p = preset_problems("glm5", ActFormat::NVFP4_EMULATED)[0];
  const ProblemFeasibility pf = check_feasibility("moe-gemm", p, a);
  for (const char* name : {"sm120-mma-bs 128x256x256 s2", "sm120-mma-bs 256x128x256 s2"}) {
    const TacticVerdict* v = find_verdict(pf, name);
    ASSERT_NE(v, nullptr) << name;
    EXPECT_TRUE(v->feasibility.only_rejected_for(RejectKind::SharedMemory)) << v->feasibility.reason();
    EXPECT_NE(v->feasibility.reason().find("needs 121,856 B of shared memory (sizeof(SharedStorage) of its CUTLASS "
                                           "types); sm_120 allows 101,376 B per block"),
              std::string::npos)
        << v->feasibility.reason();
    ASSERT_TRUE(v->feasibility.smem.has_value());
    EXPECT_EQ(v->feasibility.smem->total(), 121856);
  }
  // 3 stages at K = 128 fit; this binary has no kernel of that tile.
  const TacticVerdict* s3 = find_verdict(pf, "sm120-mma-bs 128x256x128 s3");
  ASSERT_NE(s3, nullptr);
  EXPECT_TRUE(s3->feasibility.only_rejected_for(RejectKind::NotBuilt)) << s3->feasibility.reason();
  EXPECT_NE(s3->feasibility.reason().find("94,208 of 101,376 B"), std::string::npos) << s3->feasibility.reason();
  // The built ones run (in this model of the machine: compiled, not run).
  int built_ok = 0;
  for (const TacticVerdict& v : pf.feasible) built_ok += v.tactic.kernel == GemmKernel::Sm120MmaBlockScaled;
  EXPECT_EQ(built_ok, 3) << "128x32x256, 128x64x128, 128x128x128";
  // W4A16 is not what they compute; other archs have not the instructions.
  const ProblemFeasibility w4a16 = check_feasibility("moe-gemm", preset_problems("glm5", ActFormat::BF16)[0], a);
  for (const TacticVerdict& v : w4a16.rejected) {
    if (v.tactic.kernel == GemmKernel::Sm120MmaBlockScaled) {
      EXPECT_TRUE(v.feasibility.rejected_for(RejectKind::Numerics));
    }
  }
  const ProblemFeasibility on90 = check_feasibility("moe-gemm", p, arch_by_name("sm_90"));
  for (const TacticVerdict& v : on90.feasible) EXPECT_FALSE(impl_is_listed_only(v.tactic.kernel)) << tactic_name(v.tactic);
  const ProblemFeasibility on121 = check_feasibility("moe-gemm", p, arch_by_name("sm_121"));
  for (const TacticVerdict& v : on121.rejected) {
    if (v.tactic.kernel == GemmKernel::Sm120MmaBlockScaled) {
      EXPECT_TRUE(v.feasibility.rejected_for(RejectKind::Arch));
    }
  }
}

TEST(Sm1xxTactics, Sm100TakesTheWideTilesAndTheDecodeRecipe) {
  SKIP_WITHOUT_FACTS(100);
  const ArchInfo& a = arch_by_name("sm_100");
  const ProblemFeasibility pf = check_feasibility("moe-gemm", preset_problems("glm5", ActFormat::NVFP4_EMULATED)[1], a);
  int tc = 0, moe = 0;
  for (const TacticVerdict& v : pf.feasible) {
    tc += v.tactic.kernel == GemmKernel::Sm100Tcgen05BlockScaled;
    moe += v.tactic.kernel == GemmKernel::Sm100MoeDecodeBlockScaled;
    ASSERT_TRUE(v.feasibility.smem.has_value());
    EXPECT_LE(v.feasibility.smem->total(), a.smem_per_block_optin);
  }
  EXPECT_EQ(tc, 2) << "1-SM 128x64x256 and 2-SM 256x128x256";
  EXPECT_EQ(moe, 1) << "example 92's 128x64x256";
  for (const TacticVerdict& v : pf.rejected) {
    if (v.tactic.kernel == GemmKernel::Sm100Tcgen05BlockScaled) {
      EXPECT_TRUE(v.feasibility.only_rejected_for(RejectKind::NotBuilt)) << tactic_name(v.tactic) << ": " << v.feasibility.reason();
    }
  }
}

TEST(ModelPlan, Sm120PicksTheNarrowTokenTileForDecodeAndTheWideOneForPrefill) {
  SKIP_WITHOUT_FACTS(120);
  const ModelPlan plan = plan_model(arch_by_name("sm_120"), glm5_config(), {1, 8192}, true);
  std::string text = format_model_plan(plan);
  EXPECT_NE(text.find("routed experts gate_up (N 4096, K 6144), T=1\n    -> sm120-mma-bs 128x32x256"), std::string::npos)
      << text;
  EXPECT_NE(text.find("routed experts down (N 6144, K 2048), T=8192\n    -> sm120-mma-bs 128x128x128"), std::string::npos)
      << text;
  EXPECT_NE(text.find("nvfp4_act_quant"), std::string::npos);
  EXPECT_NE(text.find("indexer_score_mma"), std::string::npos);
  EXPECT_NE(text.find("MLA decode"), std::string::npos);
  EXPECT_NE(text.find("compiled, not run"), std::string::npos);
}

TEST(ModelPlan, Sm100UsesTheDecodeRecipeForFewRowsAndTwoSmTilesForMany) {
  SKIP_WITHOUT_FACTS(100);
  const ModelPlan plan = plan_model(arch_by_name("sm_100"), glm5_config(), {1, 8192}, true);
  const std::string text = format_model_plan(plan);
  EXPECT_NE(text.find("T=1\n    -> sm100-moe-bs 128x64x256"), std::string::npos) << text;
  EXPECT_NE(text.find("T=8192\n    -> sm100-tcgen05-bs 256x128x256"), std::string::npos) << text;
  EXPECT_NE(text.find("cluster2"), std::string::npos) << text;
}

TEST(ModelPlan, RowsPerHitExpertFollowUniformRouting) {
  EXPECT_DOUBLE_EQ(rows_per_hit_expert(1, 256, 8), 1.0);  // 8 rows on 8 experts
  EXPECT_NEAR(rows_per_hit_expert(64, 256, 8), 512.0 / (256.0 * (1 - std::pow(1 - 8.0 / 256, 64))), 1e-9);
  EXPECT_NEAR(rows_per_hit_expert(8192, 256, 8), 256.0, 1e-6);  // every expert hit
  EXPECT_EQ(rows_per_hit_expert(0, 256, 8), 0.0);
}

TEST(ModelPlan, Sm90KeepsItsOwnKernelsAndWithoutABlackwellBuildSaysWhy) {
  const ModelPlan p90 = plan_model(arch_by_name("sm_90"), glm5_config(), {1, 8192}, true);
  const std::string t90 = format_model_plan(p90);
  EXPECT_NE(t90.find("T=1\n    -> sm90-decode 128x8x64"), std::string::npos) << t90;
  EXPECT_NE(t90.find("T=8192\n    -> sm90-wgmma 128x256x64"), std::string::npos) << t90;
  EXPECT_NE(t90.find("FlashInfer SM90 MLA"), std::string::npos) << t90;
  if (sm1xx_facts_available()) return;
  std::string why;
  const Tactic t = pick_moe_gemm(preset_problems("glm5", ActFormat::NVFP4_EMULATED)[0], arch_by_name("sm_120"), 1.0, &why);
  EXPECT_EQ(t, fallback_tactic("moe-gemm"));
  EXPECT_NE(why.find("no block-scaled kernel in this build"), std::string::npos) << why;
}
