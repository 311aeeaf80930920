// The architecture model and the feasibility arithmetic of our sm90 kernels, the baseline and the
// fallback. The Blackwell tactics (shared memory from their CUTLASS types) are tested in
// sm1xx_tactics_test.cpp and sm120_smem_arithmetic_test.cpp.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "gpu_test.hpp"
#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"
#include "tuner/tune_report.hpp"

using namespace fp4moe;
using namespace fp4moe::tuner;

namespace {

GemmProblem glm5_gate_up(ActFormat act = ActFormat::BF16) { return preset_problems("glm5", act)[0]; }

}  // namespace

TEST(Arch, TableHasEveryArchitectureWithTheGuideNumbers) {
  EXPECT_EQ(arch_table().size(), 8u);
  const ArchInfo& a80 = arch_by_name("sm_80");
  EXPECT_EQ(a80.smem_per_block_optin, 166912);  // 163 KB
  EXPECT_EQ(a80.smem_per_sm, 167936);
  for (const char* n : {"sm_86", "sm_89", "sm_120", "sm_121"}) {
    EXPECT_EQ(arch_by_name(n).smem_per_block_optin, 101376) << n;  // 99 KB
    EXPECT_EQ(arch_by_name(n).smem_per_sm, 102400) << n;           // 100 KB
    EXPECT_EQ(arch_by_name(n).max_threads_per_sm, 1536) << n;
  }
  for (const char* n : {"sm_90", "sm_100", "sm_103"}) {
    EXPECT_EQ(arch_by_name(n).smem_per_block_optin, 232448) << n;  // 227 KB
    EXPECT_EQ(arch_by_name(n).smem_per_sm, 233472) << n;           // 228 KB
    EXPECT_EQ(arch_by_name(n).max_threads_per_sm, 2048) << n;
  }
  for (const ArchInfo& a : arch_table()) {
    EXPECT_EQ(a.regs_per_sm, 65536);
    EXPECT_EQ(a.regs_per_thread_max, 255);
    EXPECT_EQ(a.max_threads_per_block, 1024);
    EXPECT_EQ(a.swizzle_align, 1024);
    EXPECT_EQ(a.wgmma, a.cc == 90) << a.name;
    EXPECT_EQ(a.tcgen05, a.cc == 100 || a.cc == 103) << a.name;
    EXPECT_EQ(a.block_scaled_mma, a.cc >= 100) << a.name;
    EXPECT_EQ(a.tma, a.cc >= 90) << a.name;
  }
  EXPECT_EQ(arch_by_name("sm_90").sm_count, 132);
}

TEST(Arch, NamesInEveryCommonSpelling) {
  EXPECT_EQ(arch_by_name("sm_120").cc, 120);
  EXPECT_EQ(arch_by_name("sm120a").cc, 120);
  EXPECT_EQ(arch_by_name("12.1").cc, 121);
  EXPECT_EQ(arch_by_name("90").cc, 90);
  EXPECT_EQ(arch_by_name("SM_100A").cc, 100);
  EXPECT_EQ(arch_by_name("compute_103").cc, 103);
  for (const char* bad : {"sm_77", "", "sm_", "hopper", "9.0.1", "sm_90x"}) {
    try {
      arch_by_name(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unknown architecture"), std::string::npos) << e.what();
    }
  }
}

TEST(Arch, DeviceNumbersMatchTheTable) {
  FP4MOE_SKIP_WITHOUT_GPU();
  const ArchInfo d = device_arch();
  EXPECT_EQ(d.source, "device");
  EXPECT_GT(d.sm_count, 0);
  EXPECT_FALSE(d.gpu_name.empty());
  const ArchInfo& t = arch_by_name(d.name);
  EXPECT_EQ(d.smem_per_block_optin, t.smem_per_block_optin);
  EXPECT_EQ(d.smem_per_sm, t.smem_per_sm);
  EXPECT_EQ(d.max_threads_per_sm, t.max_threads_per_sm);
}

TEST(SmemPlan, LaysTermsOutLikeAStructWithAlignas) {
  SmemPlan p;
  p.add("a", 100, 1);
  p.add("b", 10, 1024);   // padded to 1024
  p.add("c", 8, 8);       // 1034 -> 1040
  p.end_struct("s", 1024);
  EXPECT_EQ(p.terms()[1].offset, 1024);
  EXPECT_EQ(p.terms()[1].pad, 924);
  EXPECT_EQ(p.terms()[2].offset, 1040);
  EXPECT_EQ(p.total(), 2048);
  EXPECT_EQ(p.raw_bytes(), 118);
  EXPECT_EQ(p.padding(), 2048 - 118);
  EXPECT_THROW(p.add("bad", 1, 3), Error);
  const std::string text = p.explain();
  EXPECT_NE(text.find("2,048 B"), std::string::npos) << text;
}

// The shared memory the tuner counts for our sm90 kernels, against numbers computed by hand from
// the carve-up (not from sm90_tile_layout.hpp, which the tuner itself sums): 1,024 B of base
// alignment slack + per stage (block_n x 64 BF16 activations + 4,096 B of codes + 512 B of
// scales + 16 B of mbarriers) + the scheduler's (E + 3) x 4 B rounded to 16 (E = 256: 1,040 B).
// The GPU test Sm90MoeGemm.KernelResourcesMatchTheLayoutArithmetic checks the same bytes
// against the compiled kernels' attributes and occupancy.
TEST(Sm90, SharedMemoryOfOurKernelsMatchesHandComputedBytes) {
  const ArchInfo& a = arch_by_name("sm_90");
  struct Expect {
    const char* tactic;
    int64_t bytes;
  };
  const Expect expect[] = {
      {"sm90-wgmma 128x256x64 s6", 1024 + 6 * (256 * 128 + 4096 + 512 + 16) + 1040},   // 226,416
      {"sm90-wgmma 128x128x64 s8", 1024 + 8 * (128 * 128 + 4096 + 512 + 16) + 1040},   // 170,128
      {"sm90-wgmma 128x64x64 s12", 1024 + 12 * (64 * 128 + 4096 + 512 + 16) + 1040},   // 155,856
      {"sm90-wgmma 128x16x64 s16", 1024 + 16 * (16 * 128 + 4096 + 512 + 16) + 1040},   // 108,816
      {"sm90-wgmma 128x64x64 s4", 1024 + 4 * (64 * 128 + 4096 + 512 + 16) + 1040},     // 53,328
      {"sm90-decode 128x8x64 s13", 1024 + 13 * (8 * 128 + 4096 + 512 + 16) + 1040},   // 75,488
      {"sm90-decode 128x16x64 s11", 1024 + 11 * (16 * 128 + 4096 + 512 + 16) + 1040}, // 75,456
      {"sm90-decode 128x32x64 s8", 1024 + 8 * (32 * 128 + 4096 + 512 + 16) + 1040},   // 71,824
  };
  EXPECT_EQ(expect[0].bytes, 226416);
  EXPECT_EQ(expect[5].bytes, 75488);
  for (const GemmProblem& p : preset_problems("glm5")) {
    ASSERT_EQ(p.num_experts, 256);
    const ProblemFeasibility pf = check_feasibility("moe-gemm", p, a);
    for (const Expect& e : expect) {
      const TacticVerdict* v = find_verdict(pf, e.tactic);
      ASSERT_NE(v, nullptr) << e.tactic << " is not in the registry";
      EXPECT_TRUE(v->feasibility.ok) << e.tactic << ": " << v->feasibility.reason();
      ASSERT_TRUE(v->feasibility.smem.has_value()) << e.tactic;
      EXPECT_EQ(v->feasibility.smem->total(), e.bytes) << e.tactic;
    }
    // The deepest decode rings: one stage more would not fit a third of the SM (3 CTAs per SM:
    // 233,472 / 3 - 1,024 = 76,800 B per CTA).
    EXPECT_GT(1024 + 14 * (8 * 128 + 4096 + 512 + 16) + 1040, 76800);
    EXPECT_GT(1024 + 12 * (16 * 128 + 4096 + 512 + 16) + 1040, 76800);
    EXPECT_GT(1024 + 9 * (32 * 128 + 4096 + 512 + 16) + 1040, 76800);
    // Every listed config of ours is accepted on sm_90; nothing of ours, the baseline or the
    // fallback is rejected there; the Blackwell listings are, for their arch.
    int sm90_ok = 0, decode_ok = 0;
    for (const TacticVerdict& v : pf.feasible) {
      sm90_ok += v.tactic.kernel == GemmKernel::Sm90Wgmma;
      decode_ok += v.tactic.kernel == GemmKernel::Sm90Decode;
    }
    EXPECT_EQ(decode_ok, 3) << "decode block_n 8, 16, 32";
    EXPECT_GE(sm90_ok, 4);
    for (const TacticVerdict& v : pf.rejected) {
      EXPECT_NE(v.tactic.kernel, GemmKernel::Sm90Wgmma) << tactic_name(v.tactic) << ": " << v.feasibility.reason();
      EXPECT_NE(v.tactic.kernel, GemmKernel::Sm90Decode) << tactic_name(v.tactic) << ": " << v.feasibility.reason();
      EXPECT_NE(v.tactic.kernel, GemmKernel::Generic);
      EXPECT_NE(v.tactic.kernel, GemmKernel::DequantCublas);
      if (v.tactic.kernel == GemmKernel::Sm100Tcgen05BlockScaled || v.tactic.kernel == GemmKernel::Sm120MmaBlockScaled) {
        EXPECT_TRUE(v.feasibility.rejected_for(RejectKind::Arch));
      }
    }
  }
}

TEST(Sm90, RejectedElsewhereAndForBadShapes) {
  GemmProblem p = glm5_gate_up();
  const ProblemFeasibility pf = check_feasibility("moe-gemm", p, arch_by_name("sm_120"));
  const TacticVerdict* v = find_verdict(pf, "sm90-wgmma 128x256x64 s6");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->feasibility.rejected_for(RejectKind::Arch));
  EXPECT_TRUE(v->feasibility.rejected_for(RejectKind::SharedMemory));  // 226 KB > 99 KB as well
  const TacticVerdict* d = find_verdict(pf, "sm90-decode 128x8x64 s13");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->feasibility.rejected_for(RejectKind::Arch));  // built for sm_90a only
  p.n = 4000;  // not a multiple of the 128-row tile
  const ProblemFeasibility bad = check_feasibility("moe-gemm", p, arch_by_name("sm_90"));
  for (const TacticVerdict& t : bad.rejected)
    if (t.tactic.kernel == GemmKernel::Sm90Wgmma) {
      EXPECT_TRUE(t.feasibility.rejected_for(RejectKind::Shape));
    }
  for (const TacticVerdict& t : bad.feasible) EXPECT_NE(t.tactic.kernel, GemmKernel::Sm90Wgmma);
}

TEST(Fallback, GenericAcceptsAnyShapeOnEveryArchitecture) {
  const Tactic fb = fallback_tactic("moe-gemm");
  EXPECT_EQ(fb.kernel, GemmKernel::Generic);
  EXPECT_THROW(fallback_tactic("attention"), Error);
  EXPECT_THROW(tactics_for("attention", glm5_gate_up()), Error);
  for (const ArchInfo& a : arch_table())
    for (GemmProblem p : {glm5_gate_up(), GemmProblem{3, 96, 48, 1, WeightFormat::NVFP4, ActFormat::BF16, Epilogue::None, "odd"},
                          GemmProblem{1, 2, 32, 1, WeightFormat::MXFP4, ActFormat::BF16, Epilogue::SiluMul, "tiny"}}) {
      bool found = false;
      for (const TacticDef& d : tactics_for("moe-gemm", p))
        if (d.tactic == fb) {
          found = true;
          const Feasibility f = d.valid(p, a);
          EXPECT_TRUE(f.ok) << a.name << " " << to_string(p) << ": " << f.reason();
        }
      EXPECT_TRUE(found);
    }
}
