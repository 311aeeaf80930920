// The architecture model and the feasibility arithmetic of our sm90 kernels, the baseline and the
// fallback. The Blackwell tactics (shared memory from their CUTLASS types) are tested in
// sm1xx_tactics_test.cpp.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"
#include "tuner/arch.hpp"
#include "tuner/tactic.hpp"
#include "tuner/tune_report.hpp"

using namespace fp4moe;
using namespace fp4moe::tuner;

namespace {

GemmProblem glm5_gate_up(Act act = Act::BF16) { return preset_problems("glm5", act)[0]; }

const TacticVerdict* find_verdict(const ProblemFeasibility& pf, const std::string& name) {
  for (const auto* list : {&pf.feasible, &pf.rejected})
    for (const TacticVerdict& v : *list)
      if (v.tactic.name() == name) return &v;
  return nullptr;
}

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
  if (!have_device()) GTEST_SKIP() << "no GPU";
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

TEST(Sm90, EveryConfigOfOurKernelIsAcceptedOnSm90WithTheLayoutHeadersBytes) {
  const ArchInfo& a = arch_by_name("sm_90");
  for (const GemmProblem& p : preset_problems("glm5")) {
    const ProblemFeasibility pf = check_feasibility("moe-gemm", p, a);
    int sm90_ok = 0;
    for (const TacticVerdict& v : pf.feasible) {
      if (v.tactic.impl != Impl::Sm90Wgmma) continue;
      ++sm90_ok;
      ASSERT_TRUE(v.feasibility.smem.has_value());
      const auto l = cuda::sm90::sm90_smem_layout(v.tactic.cfg.block_n, v.tactic.cfg.stages, p.num_experts);
      EXPECT_EQ(v.feasibility.smem->total(), int64_t(l.total)) << v.tactic.name();
      EXPECT_LE(v.feasibility.smem->total(), a.smem_per_block_optin);
      EXPECT_LE(v.feasibility.smem->total(), int64_t(cuda::sm90::sm90_smem_limit(v.tactic.cfg.block_n)));
    }
    int decode_ok = 0;
    for (const TacticVerdict& v : pf.feasible) {
      if (v.tactic.impl != Impl::Sm90Decode) continue;
      ++decode_ok;
      ASSERT_TRUE(v.feasibility.smem.has_value());
      const auto l = cuda::sm90::sm90_smem_layout(v.tactic.cfg.block_n, v.tactic.cfg.stages, p.num_experts);
      EXPECT_EQ(v.feasibility.smem->total(), int64_t(l.total)) << v.tactic.name();
      // 3 CTAs per SM: each within a third of the SM's 233,472 B less the 1 KB reserved.
      EXPECT_LE(v.feasibility.smem->total(), a.smem_per_sm / cuda::sm90::kDecodeCtasPerSm - a.smem_reserved_per_block);
      EXPECT_EQ(int64_t(cuda::sm90::sm90_decode_smem_limit()),
                a.smem_per_sm / cuda::sm90::kDecodeCtasPerSm - a.smem_reserved_per_block);
    }
    EXPECT_EQ(decode_ok, 3) << "decode block_n 8, 16, 32";
    for (const TacticVerdict& v : pf.rejected) {
      EXPECT_NE(v.tactic.impl, Impl::Sm90Wgmma) << v.tactic.name() << ": " << v.feasibility.reason();
      EXPECT_NE(v.tactic.impl, Impl::Sm90Decode) << v.tactic.name() << ": " << v.feasibility.reason();
      EXPECT_NE(v.tactic.impl, Impl::Generic);
      EXPECT_NE(v.tactic.impl, Impl::DequantCublas);
      if (v.tactic.impl == Impl::Sm100Tcgen05BlockScaled || v.tactic.impl == Impl::Sm120MmaBlockScaled) {
        EXPECT_TRUE(v.feasibility.rejected_for(RejectKind::Arch));
      }
    }
    EXPECT_GE(sm90_ok, 4);
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
    if (t.tactic.impl == Impl::Sm90Wgmma) {
      EXPECT_TRUE(t.feasibility.rejected_for(RejectKind::Shape));
    }
  for (const TacticVerdict& t : bad.feasible) EXPECT_NE(t.tactic.impl, Impl::Sm90Wgmma);
}

TEST(Fallback, GenericAcceptsAnyShapeOnEveryArchitecture) {
  const Tactic fb = fallback_tactic("moe-gemm");
  EXPECT_EQ(fb.impl, Impl::Generic);
  EXPECT_THROW(fallback_tactic("attention"), Error);
  EXPECT_THROW(tactics_for("attention", glm5_gate_up()), Error);
  for (const ArchInfo& a : arch_table())
    for (GemmProblem p : {glm5_gate_up(), GemmProblem{3, 96, 48, 1, WeightFormat::NVFP4, Act::BF16, Epi::None, "odd"},
                          GemmProblem{1, 2, 32, 1, WeightFormat::MXFP4, Act::BF16, Epi::SiluMul, "tiny"}}) {
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
