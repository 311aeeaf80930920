// sm_120's shared-memory verdicts (which NVFP4 grouped-GEMM tiles fit the 101,376 B a block may
// opt into) against hand arithmetic written here from reading CUTLASS 4.5's source, term by
// term, with the constants spelled out: NOT computed from the headers the facts translation
// units instantiate. The facts (sizeof of the instantiated CUTLASS types, cuda/moe_gemm_sm1xx)
// must equal these sums, the auto stage count must equal the hand count, and the tuner's verdict
// must say fit / no fit. Compiled, not run (no Blackwell GPU). The facts need the CUTLASS types:
// skipped in builds without sm_120a.
#include <algorithm>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "tuner/sm1xx_build.hpp"
#include "tuner/arch.hpp"
#include "tuner/sm1xx_tactics.hpp"
#include "tuner/tactic.hpp"
#include "tuner/tune_report.hpp"

#ifdef FP4MOE_HAVE_CUDA
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"
#endif

using namespace fp4moe;
using namespace fp4moe::tuner;

namespace {

constexpr int64_t kOptin = 101376;  // sm_120: 99 KB per block (cudaDevAttrMaxSharedMemoryPerBlockOptin)
int64_t up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One pipeline stage of the sm_120 block-scaled mainloop, swap-AB orientation (M = weight rows,
// N = tokens), NVFP4 = 4 bits, one E4M3 scale per 16 elements:
//   A M x K / 2 + B N x K / 2 + SFA M x K / 16 + SFB max(N, 128) x K / 16
// (the SFB smem tile is padded to one 128-row scale atom).
int64_t stage_bytes(int64_t m, int64_t n, int64_t k) {
  return m * k / 2 + n * k / 2 + m * k / 16 + std::max<int64_t>(n, 128) * k / 16;
}
// The mainloop's rings; its A / B are 1024-B aligned, so the struct is a multiple of 1024.
int64_t mainloop_bytes(int64_t m, int64_t n, int64_t k, int s) { return up(s * stage_bytes(m, n, k), 1024); }
// The epilogue's tensors: D staged in 64 x 32 BF16 subtiles, 2 stages (8,192 B); an FP32 C (not
// reused: 32 != 16 bits) adds 2 x 64 x 32 x 4 = 16,384 B; then the empty fusion storage (1 B)
// and the 1024-B swizzle alignment of the D buffer: 9,216 B, or 25,600 B with the C.
int64_t epilogue_bytes(bool f32_source) { return up(2 * 64 * 32 * 2 + (f32_source ? 2 * 64 * 32 * 4 : 0) + 1, 1024); }
// The kernel's whole shared storage: tensors (mainloop + epilogue), then the pipelines' barriers
// (scheduler 8 stages x 16 B = 128, mainloop s x 16, epilogue load 2 x 16, load order 16),
// 128 B of scheduler responses, the 7 TMA descriptors the ptr-array kernel rewrites per group
// (A, B, SFA, SFB, C, and D per epilogue warpgroup x 2; 128 B each, 128-B aligned), and the
// struct rounded to its 1024-B alignment.
int64_t total_bytes(int64_t m, int64_t n, int64_t k, int s, bool f32) {
  const int64_t tensors = mainloop_bytes(m, n, k, s) + epilogue_bytes(f32);
  const int64_t barriers = 128 + 16 * s + 32 + 16;
  return up(up(tensors + barriers + 128, 128) + 7 * 128, 1024);
}
// StageCountAutoCarveout: (capacity - kernel extras - epilogue SharedStorage) / (stage + 128 B
// of its pipeline barriers). Extras: the scheduler pipeline (128), 2 TMA descriptors (256), the
// tensor-map-ready pipeline (3 x 16 = 48). Epilogue SharedStorage = its tensors + 3 descriptors
// (384) + the C load pipeline (2 x 16), rounded to the tensors' 1024-B alignment.
int auto_stages(int64_t m, int64_t n, int64_t k, bool f32) {
  const int64_t carveout = up(epilogue_bytes(f32) + 384 + 32, 1024);
  return int((kOptin - 128 - 256 - 48 - carveout) / (stage_bytes(m, n, k) + 128));
}

struct Row {
  int m, n, k, stages;  // stages 0: StageCountAutoCarveout
  bool f32;
  int hand_stages;
  int64_t hand_bytes;   // the README table's number
};

// The README table (cuda/moe_gemm_sm1xx/README.md), by hand.
constexpr Row kTable[] = {
    {128, 32, 128, 0, false, 7, 97280},   {128, 64, 128, 0, false, 6, 97280},  {128, 128, 128, 0, false, 4, 84992},
    {128, 32, 256, 0, false, 3, 84992},   {128, 64, 256, 0, false, 3, 97280},  {128, 128, 256, 0, false, 2, 84992},
    {128, 256, 128, 0, false, 3, 94208},  {256, 128, 128, 0, false, 3, 94208}, {128, 256, 128, 2, false, 2, 66560},
    {128, 256, 128, 3, false, 3, 94208},  {256, 128, 128, 3, false, 3, 94208}, {128, 256, 128, 3, true, 3, 110592},
    {128, 256, 128, 0, true, 2, 82944},   {128, 256, 256, 2, false, 2, 121856}, {256, 128, 256, 2, false, 2, 121856},
};

}  // namespace

TEST(Sm120SmemArithmetic, TheHandTableIsItsOwnArithmetic) {
  ASSERT_EQ(arch_by_name("sm_120").smem_per_block_optin, kOptin);
  for (const Row& r : kTable) {
    const int s = r.stages ? r.stages : auto_stages(r.m, r.n, r.k, r.f32);
    EXPECT_EQ(s, r.hand_stages) << r.m << "x" << r.n << "x" << r.k;
    EXPECT_EQ(total_bytes(r.m, r.n, r.k, s, r.f32), r.hand_bytes) << r.m << "x" << r.n << "x" << r.k << " s" << s;
  }
  // The seed's finding, by hand: the wide tiles at K = 128 fit at 3 stages beside our BF16
  // epilogue (7,168 B to spare), not beside an FP32 C (9,216 B over); at K = 256 even 2 stages
  // are 20,480 B over.
  EXPECT_EQ(kOptin - total_bytes(128, 256, 128, 3, false), 7168);
  EXPECT_EQ(total_bytes(128, 256, 128, 3, true) - kOptin, 9216);
  EXPECT_EQ(total_bytes(256, 128, 256, 2, false) - kOptin, 20480);
}

#ifdef FP4MOE_HAVE_CUDA
namespace bs = cuda::sm1xx;

TEST(Sm120SmemArithmetic, CutlassTypesEqualTheHandSumsTermByTerm) {
  int seen = 0;
  for (const Row& r : kTable) {
    const bs::BsKernelFacts* f = nullptr;
    for (const bs::BsKernelFacts& x : bs::bs_type_facts())
      if (x.recipe == bs::BsRecipe::Sm120Grouped && x.tile_m == r.m && x.tile_n == r.n && x.tile_k == r.k &&
          x.f32_source == r.f32 && (r.stages ? (!x.auto_stages && x.stages == r.stages) : x.auto_stages))
        f = &x;
    if (!f) continue;
    ++seen;
    SCOPED_TRACE(f->name());
    EXPECT_EQ(f->stages, r.hand_stages);
    EXPECT_EQ(f->mainloop_bytes, mainloop_bytes(r.m, r.n, r.k, f->stages));
    EXPECT_EQ(f->epilogue_bytes, epilogue_bytes(r.f32));
    EXPECT_EQ(f->smem_bytes, r.hand_bytes);
    EXPECT_EQ(f->builder_capacity, kOptin);
  }
  if (seen == 0) FP4MOE_SKIP_UNLESS_BUILT_FOR(120);
  EXPECT_EQ(seen, int(std::size(kTable)));
}

TEST(Sm120SmemArithmetic, TunerVerdictsFollowTheBytes) {
  if (!sm1xx_facts_available()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_TRUE(sm1xx_facts_available()) << "built for Blackwell but no CUTLASS facts";
  const ArchInfo& a = arch_by_name("sm_120");
  const GemmProblem p = preset_problems("glm5", ActFormat::NVFP4_EMULATED)[0];
  const ProblemFeasibility pf = check_feasibility("moe-gemm", p, a);
  int judged = 0;
  for (const auto* list : {&pf.feasible, &pf.rejected})
    for (const TacticVerdict& v : *list) {
      if (v.tactic.kernel != GemmKernel::Sm120MmaBlockScaled) continue;
      for (const Row& r : kTable) {
        if (r.f32 || r.m != v.tactic.block_m || r.n != v.tactic.block_n || r.k != v.tactic.block_k ||
            r.hand_stages != v.tactic.stages)
          continue;
        EXPECT_EQ(v.feasibility.rejected_for(RejectKind::SharedMemory), r.hand_bytes > kOptin) << tactic_name(v.tactic);
        ASSERT_TRUE(v.feasibility.smem.has_value()) << tactic_name(v.tactic);
        EXPECT_EQ(v.feasibility.smem->total(), r.hand_bytes) << tactic_name(v.tactic);
        ++judged;
        break;
      }
    }
  EXPECT_GE(judged, 10);
}
#endif
