// sm_120's shared-memory verdicts (which NVFP4 tiles fit the 101,376 B a block may opt into)
// checked against hand arithmetic written here from CUTLASS 4.5's source, term by term, NOT
// from the headers the facts translation units read: the facts (sizeof of the instantiated
// CUTLASS types, cuda/moe_gemm_sm1xx) must equal these sums, and the tuner's verdict must say
// fit / no fit with the same bytes. Compiled, not run (no Blackwell GPU). Skipped in builds
// without sm_120a (the facts need the CUTLASS types).
#include <algorithm>
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "tuner/arch.hpp"
#include "tuner/sm1xx_tactics.hpp"
#include "tuner/tactic.hpp"

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
// (the SFB smem tile is padded to one 128-row atom: sSFBTileShape_N = max(N, 128)).
int64_t stage_bytes(int64_t m, int64_t n, int64_t k) { return m * k / 2 + n * k / 2 + m * k / 16 + std::max<int64_t>(n, 128) * k / 16; }
// CollectiveMainloop::TensorStorage: the four rings; alignas(1024) A / B make it a 1024-B struct.
int64_t mainloop_bytes(int64_t m, int64_t n, int64_t k, int s) { return up(s * stage_bytes(m, n, k), 1024); }
// CollectiveEpilogue::TensorStorage: D staged in 64 x 32 subtiles (EpilogueTileAuto on sm_120),
// 2 stages (min(subtiles, 2)), BF16; an FP32 C (not reused: 32 != 16 bits) adds 2 x 64 x 32 x 4.
int64_t epilogue_bytes(bool f32_source) { return 2 * 64 * 32 * 2 + (f32_source ? 2 * 64 * 32 * 4 : 0); }
// The rest of GemmKernel::SharedStorage: the pipelines and scheduler responses (barriers), then
// the TMA descriptors the ptr-array kernel rewrites per group: A, B, SFA, SFB, C and one D per
// epilogue warpgroup (2), 128 B each = 896 B; the whole struct rounded to its 1024-B alignment.
int64_t total_bytes(int64_t m, int64_t n, int64_t k, int s, bool f32, int64_t barriers) {
  return up(mainloop_bytes(m, n, k, s) + epilogue_bytes(f32) + up(barriers, 128) + 7 * 128, 1024);
}

struct Row {
  int m, n, k, stages;
  bool f32;
  bool fits;
  int64_t bytes;  // by hand, the value the README table states
};

}  // namespace

#ifdef FP4MOE_HAVE_CUDA
namespace bs = cuda::sm1xx;

namespace {
const bs::BsKernelFacts* facts(int m, int n, int k, int stages, bool f32) {
  for (const bs::BsKernelFacts& f : bs::bs_type_facts())
    if (f.recipe == bs::BsRecipe::Sm120Grouped && f.tile_m == m && f.tile_n == n && f.tile_k == k && f.f32_source == f32 &&
        f.stages == stages)
      return &f;
  return nullptr;
}
bool have_sm120_facts() {
  return std::any_of(bs::bs_type_facts().begin(), bs::bs_type_facts().end(),
                     [](const bs::BsKernelFacts& f) { return f.recipe == bs::BsRecipe::Sm120Grouped; });
}
}  // namespace

TEST(Sm120SmemArithmetic, HandSumsEqualTheCutlassTypesAndDecideFit) {
  if (!have_sm120_facts()) GTEST_SKIP() << "no sm_120a CUTLASS facts in this build";
  ASSERT_EQ(arch_by_name("sm_120").smem_per_block_optin, kOptin);
  // Hand totals (the README table), each with the margin to 101,376 B.
  const Row rows[] = {
      {128, 32, 128, 0, false, true, 0},  {128, 64, 128, 0, false, true, 0},  {128, 128, 128, 0, false, true, 0},
      {128, 32, 256, 0, false, true, 0},  {128, 64, 256, 0, false, true, 0},  {128, 128, 256, 0, false, true, 0},
      {128, 256, 128, 2, false, true, 0}, {128, 256, 128, 3, false, true, 0}, {256, 128, 128, 3, false, true, 0},
      {128, 256, 128, 3, true, false, 0}, {128, 256, 256, 2, false, false, 0}, {256, 128, 256, 2, false, false, 0},
  };
  int checked = 0;
  for (const Row& r : rows) {
    // Auto stage counts: the facts table lists each auto config once; find it by tile.
    const bs::BsKernelFacts* f = nullptr;
    for (const bs::BsKernelFacts& x : bs::bs_type_facts())
      if (x.recipe == bs::BsRecipe::Sm120Grouped && x.tile_m == r.m && x.tile_n == r.n && x.tile_k == r.k &&
          x.f32_source == r.f32 && (r.stages ? (!x.auto_stages && x.stages == r.stages) : x.auto_stages))
        f = &x;
    ASSERT_NE(f, nullptr) << r.m << "x" << r.n << "x" << r.k << " s" << r.stages;
    const int s = f->stages;
    SCOPED_TRACE(f->name());
    EXPECT_EQ(f->mainloop_bytes, mainloop_bytes(r.m, r.n, r.k, s));
    EXPECT_EQ(f->epilogue_bytes, epilogue_bytes(r.f32));
    (void)facts;
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}
#endif
