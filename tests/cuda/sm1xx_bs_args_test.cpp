// Host-side checks of the Blackwell NVFP4 grouped GEMMs' arguments (no GPU needed; the kernels
// are compiled, not run): the scale-factor layout arithmetic against CUTLASS's own layout
// functors, the per-group pointers, strides and SF layouts the device builder writes (its host
// twin), CUTLASS's can_implement and get_workspace_size, the workspace carve-up, and the weight
// scale-factor re-layout.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/moe_gemm_sm1xx/moe_gemm_sm1xx.hpp"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_layout.hpp"
#include "tuner/sm1xx_build.hpp"

using namespace fp4moe;
using namespace fp4moe::cuda;
using namespace fp4moe::cuda::sm1xx;

namespace {

constexpr uint64_t kW = 0x100000000ull, kWsf = 0x200000000ull, kX = 0x300000000ull, kXsf = 0x400000000ull,
                   kY = 0x500000000ull;

// (row, k element) probes: atom corners, row 31 / 32 / 127 / 128 borders, K-atom borders.
std::vector<int64_t> probes(int rows, int k) {
  std::vector<int64_t> p;
  for (int r : {0, 1, 31, 32, 33, 95, 96, 127, 128, 129, 255, 300})
    for (int kk : {0, 15, 16, 63, 64, 127, 128, 200, 511})
      if (r < rows && kk < k) {
        p.push_back(r);
        p.push_back(kk);
      }
  return p;
}

BsGroupInput input(int n, int k, const std::vector<int32_t>& offsets, int max_n = 0) {
  BsGroupInput in;
  in.n = n;
  in.k = k;
  in.groups = int(offsets.size()) - 1;
  in.offsets = offsets.data();
  in.max_n = max_n;
  in.w = kW;
  in.w_sf = kWsf;
  in.x = kX;
  in.x_sf = kXsf;
  in.y = kY;
  return in;
}

}  // namespace

TEST(Sm1xxLayout, ScaleFactorOffsetsAreABijectionOntoThePaddedAtoms) {
  for (auto [rows, k] : {std::pair{128, 256}, std::pair{200, 192}, std::pair{1, 64}, std::pair{384, 1024}}) {
    std::set<int64_t> seen;
    for (int64_t r = 0; r < sf_rows(rows); ++r)
      for (int64_t kb = 0; kb < sf_cols(k); ++kb) {
        const int64_t o = sf_offset(r, kb, k);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, sf_bytes(rows, k));
        ASSERT_TRUE(seen.insert(o).second) << rows << "x" << k << " row " << r << " kb " << kb;
      }
    EXPECT_EQ(int64_t(seen.size()), sf_bytes(rows, k));
  }
  // Inside an atom: (r % 32) * 16 + (r / 32) * 4 + c; atoms along K first.
  EXPECT_EQ(sf_offset(0, 0, 512), 0);
  EXPECT_EQ(sf_offset(1, 0, 512), 16);
  EXPECT_EQ(sf_offset(32, 0, 512), 4);
  EXPECT_EQ(sf_offset(33, 3, 512), 16 + 4 + 3);
  EXPECT_EQ(sf_offset(0, 4, 512), 512);          // next K atom
  EXPECT_EQ(sf_offset(128, 0, 512), 8 * 512);    // 512 / 64 = 8 K atoms per 128 rows
  EXPECT_EQ(sf_cols(6144), 384);
  EXPECT_EQ(sf_cols(2048 + 16), 132);            // 129 SF -> padded to 132
}

TEST(Sm1xxLayout, ExpertScaleFactorRowsNeverOverlap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int experts = 1 + int(rng() % 300);
    std::vector<int64_t> off(size_t(experts) + 1, 0);
    for (int e = 0; e < experts; ++e) off[size_t(e) + 1] = off[size_t(e)] + int64_t(rng() % 3 == 0 ? 0 : rng() % 300);
    for (int e = 0; e < experts; ++e) {
      const int64_t base = act_sf_row_base(e, off[size_t(e)]);
      ASSERT_EQ(base % kSfAtomRows, 0);
      ASSERT_GE(act_sf_row_base(e + 1, off[size_t(e) + 1]), base + sf_rows(off[size_t(e) + 1] - off[size_t(e)]));
    }
    ASSERT_LE(act_sf_row_base(experts - 1, off[size_t(experts) - 1]) + sf_rows(off.back() - off[size_t(experts) - 1]),
              act_sf_rows_bound(off.back(), experts));
  }
}

TEST(Sm1xxLayout, WorkspacePiecesAreAlignedAndDisjoint) {
  const BsArgTypeSizes t{12, 24, 24, 24, 40, 40};
  const BsWorkspaceLayout w = bs_workspace_layout(256, 8192, act_sf_rows_bound(8192, 256), 6144, t, 8192 * 4096 * 2, 1000);
  const std::vector<std::pair<int64_t, int64_t>> pieces = {
      {w.problem_sizes, 256 * 12}, {w.ptr_a, 256 * 8},       {w.ptr_b, 256 * 8},       {w.ptr_sfa, 256 * 8},
      {w.ptr_sfb, 256 * 8},        {w.ptr_d, 256 * 8},       {w.stride_a, 256 * 24},   {w.stride_b, 256 * 24},
      {w.stride_d, 256 * 24},      {w.layout_sfa, 256 * 40}, {w.layout_sfb, 256 * 40}, {w.alpha, 256 * 4},
      {w.tokens_per_expert, 256 * 4}, {w.act_global, 4},     {w.act_fp4, 8192 * 3072},
      {w.act_sf, act_sf_rows_bound(8192, 256) * 384},        {w.out, 8192 * 4096 * 2}, {w.cutlass, 1000}};
  int64_t end = 0;
  for (auto [at, bytes] : pieces) {
    EXPECT_EQ(at % kArgAlign, 0);
    EXPECT_GE(at, end);
    end = at + bytes;
  }
  EXPECT_GE(w.total, end);
  EXPECT_LT(w.total - end, kArgAlign);
}

TEST(Sm1xxArgs, GroupedPointersStridesAndScaleFactorLayoutsMatchTheLayoutArithmetic) {
  int checked = 0;
  for (const BsKernel& kern : bs_kernels()) {
    if (kern.facts.recipe == BsRecipe::Sm100MoeDecode) continue;
    const int n = 384, k = 512;
    // Experts with 3, 0, 127, 130 rows (an empty one, one that crosses an atom), 1 row.
    const std::vector<int32_t> off = {0, 3, 3, 130, 260, 261};
    const BsGroupInput in = input(n, k, off);
    const std::vector<int64_t> pr = probes(384, k);
    for (int g = 0; g < in.groups; ++g) {
      const int64_t m = off[size_t(g) + 1] - off[size_t(g)];
      const BsGroupArgsHost h = kern.describe_group(in, g, pr.data(), int(pr.size() / 2));
      SCOPED_TRACE(kern.facts.name() + " group " + std::to_string(g));
      EXPECT_EQ(h.m, n);  // CUTLASS M: weight rows
      EXPECT_EQ(h.n, m);  // CUTLASS N: this expert's tokens
      EXPECT_EQ(h.k, k);
      EXPECT_EQ(h.a, kW + uint64_t(g) * n * k / 2);
      EXPECT_EQ(h.b, kX + uint64_t(off[size_t(g)]) * k / 2);
      EXPECT_EQ(h.d, kY + uint64_t(off[size_t(g)]) * n * 2);
      EXPECT_EQ(h.sfa, kWsf + uint64_t(g) * sf_bytes(n, k));
      EXPECT_EQ(h.sfb, kXsf + uint64_t(act_sf_row_base(g, off[size_t(g)])) * sf_cols(k));
      // A (N, K) and B (m, K) K-major; D column-major (N, m): y[token][feature].
      EXPECT_EQ(h.stride_a[0], k);
      EXPECT_EQ(h.stride_a[1], 1);
      EXPECT_EQ(h.stride_b[0], k);
      EXPECT_EQ(h.stride_b[1], 1);
      EXPECT_EQ(h.stride_d[0], 1);
      EXPECT_EQ(h.stride_d[1], n);
      ASSERT_EQ(h.sfa_at.size(), pr.size() / 2);
      for (size_t i = 0; i < pr.size() / 2; ++i) {
        const int64_t row = pr[2 * i], kb = pr[2 * i + 1] / kSfVec;
        EXPECT_EQ(h.sfa_at[i], sf_offset(row, kb, k)) << "row " << row << " k " << pr[2 * i + 1];
        if (row < m) {
          EXPECT_EQ(h.sfb_at[i], sf_offset(row, kb, k)) << "row " << row << " k " << pr[2 * i + 1];
        }
      }
    }
    ++checked;
  }
  if (checked == 0) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  EXPECT_GT(checked, 0) << "built for Blackwell but no grouped kernel is registered";
}

TEST(Sm1xxArgs, DecodeRecipeSlabsMatchTheLayoutArithmetic) {
  int checked = 0;
  for (const BsKernel& kern : bs_kernels()) {
    if (kern.facts.recipe != BsRecipe::Sm100MoeDecode) continue;
    const int n = 256, k = 512, max_n = 40;
    const std::vector<int32_t> off = {0, 5, 5, 45, 46};
    const BsGroupInput in = input(n, k, off, max_n);
    const std::vector<int64_t> pr = probes(n, k);
    for (int g = 0; g < in.groups; ++g) {
      SCOPED_TRACE("group " + std::to_string(g));
      const BsGroupArgsHost h = kern.describe_group(in, g, pr.data(), int(pr.size() / 2));
      EXPECT_EQ(h.n, off[size_t(g) + 1] - off[size_t(g)]);
      EXPECT_EQ(h.a, kW + uint64_t(g) * n * k / 2);
      EXPECT_EQ(h.b, kX + uint64_t(slab_row(g, 0, max_n)) * k / 2);
      EXPECT_EQ(h.d, kY + uint64_t(slab_row(g, 0, max_n)) * n * 2);
      EXPECT_EQ(h.sfa, kWsf + uint64_t(g) * sf_bytes(n, k));
      EXPECT_EQ(h.sfb, kXsf + uint64_t(sf_offset(slab_sf_row(g, 0, max_n), 0, k)));
      for (size_t i = 0; i < pr.size() / 2; ++i) {
        const int64_t row = pr[2 * i], kb = pr[2 * i + 1] / kSfVec;
        EXPECT_EQ(h.sfa_at[i], sf_offset(row, kb, k));
        if (row < max_n) {
          EXPECT_EQ(h.sfb_at[i], sf_offset(row, kb, k));
        }
      }
    }
    ++checked;
  }
  if (checked == 0) FP4MOE_SKIP_UNLESS_BUILT_FOR(100);
  EXPECT_GT(checked, 0) << "built for sm_100a but its decode recipe is not registered";
}

TEST(Sm1xxArgs, CutlassCanImplementAcceptsGlm5AndRefusesMisalignedShapes) {
  if (bs_kernels().empty()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_FALSE(bs_kernels().empty()) << "built for Blackwell but no kernel is registered";
  for (const BsKernel& kern : bs_kernels()) {
    SCOPED_TRACE(kern.facts.name());
    const std::vector<int32_t> m = {1, 0, 17, 64};
    const int max_n = 64;
    EXPECT_EQ(kern.can_implement(4096, 6144, m.data(), int(m.size()), max_n), "");  // gate_up
    EXPECT_EQ(kern.can_implement(6144, 2048, m.data(), int(m.size()), max_n), "");  // down
    // K must keep 16-byte TMA rows of FP4 (32 elements): 6160 does not.
    EXPECT_NE(kern.can_implement(4096, 6160, m.data(), int(m.size()), max_n), "");
    if (kern.facts.recipe != BsRecipe::Sm100MoeDecode) {
      // D column-major N x m: N must keep 16-byte BF16 rows (8 elements).
      EXPECT_NE(kern.can_implement(4100, 6144, m.data(), int(m.size()), max_n), "");
    } else {
      const std::vector<int32_t> over = {65};
      EXPECT_NE(kern.can_implement(4096, 6144, over.data(), 1, max_n), "");  // deeper than the slab
    }
  }
}

TEST(Sm1xxArgs, WorkspaceComesFromCutlassAndTheCarveUp) {
  if (bs_kernels().empty()) FP4MOE_SKIP_UNLESS_BUILT_FOR_BLACKWELL();
  ASSERT_FALSE(bs_kernels().empty()) << "built for Blackwell but no kernel is registered";
  for (const BsKernel& kern : bs_kernels()) {
    SCOPED_TRACE(kern.facts.name());
    // Argument types: Shape<int,int,int>; strides / SF layouts as CUTLASS defines them.
    EXPECT_EQ(kern.arg_sizes.problem_shape, 12);
    EXPECT_GT(kern.arg_sizes.layout_sfa, 0);
    const size_t w188 = kern.cutlass_workspace_bytes(256, 188, 64), w376 = kern.cutlass_workspace_bytes(256, 376, 64);
    EXPECT_GE(w376, w188);  // per-SM tensor maps / scheduler state
    MoeGemmDesc d;
    d.num_experts = 256;
    d.n = 4096;
    d.k = 6144;
    d.max_tokens = 512;
    d.act = ActFormat::NVFP4_EMULATED;
    d.epilogue = Epilogue::SiluMul;
    const Sm1xxConfig c{kern.facts.recipe, kern.facts.tile_m, kern.facts.tile_n, kern.facts.tile_k};
    const BsWorkspaceLayout L = sm1xx_workspace_layout(d, c, 188, 64);
    EXPECT_GE(L.total, L.cutlass + int64_t(w188));
    const bool slabs = kern.facts.recipe == BsRecipe::Sm100MoeDecode;
    const int64_t rows = slabs ? 256 * 64 : 512;
    EXPECT_GE(L.act_sf - L.act_fp4, rows * 6144 / 2);
    EXPECT_GE(L.out - L.act_sf, (slabs ? 256 * sf_rows(64) : act_sf_rows_bound(512, 256)) * sf_cols(6144));
    EXPECT_GE(L.cutlass - L.out, rows * 4096 * 2);  // the 2I-wide gate | up output before SiLU·up
    EXPECT_EQ(sm1xx_can_implement(d, c, recipe_cc(c.recipe), 64), "");
    const int other = recipe_cc(c.recipe) == 120 ? 100 : 120;
    EXPECT_NE(sm1xx_can_implement(d, c, other, 64).find("needs sm_"), std::string::npos);
    MoeGemmDesc w16 = d;
    w16.act = ActFormat::BF16;
    EXPECT_NE(sm1xx_can_implement(w16, c, recipe_cc(c.recipe), 64).find("W4A4"), std::string::npos);
  }
}

TEST(Sm1xxWeights, ScaleFactorsAreReLaidPerExpertAndPaddedWithZero) {
  ExpertStack w;
  w.format = WeightFormat::NVFP4;
  w.num_experts = 2;
  w.n = 136;  // not a multiple of 128: a padded atom row block
  w.k = 256;
  w.packed.assign(size_t(2 * 136 * 128), 0);
  w.scales.resize(size_t(2 * 136 * 16));
  for (size_t i = 0; i < w.scales.size(); ++i) w.scales[i] = uint8_t(1 + i % 200);
  w.global_scale = {1.0f, 2.0f};
  const std::vector<uint8_t> sf = swizzle_weight_sf_sm1xx(w);
  ASSERT_EQ(int64_t(sf.size()), 2 * sf_bytes(136, 256));
  std::vector<bool> used(sf.size(), false);
  for (int e = 0; e < 2; ++e)
    for (int r = 0; r < 136; ++r)
      for (int kb = 0; kb < 16; ++kb) {
        const size_t at = size_t(e * sf_bytes(136, 256) + sf_offset(r, kb, 256));
        EXPECT_EQ(sf[at], w.scales[size_t((e * 136 + r) * 16 + kb)]);
        used[at] = true;
      }
  for (size_t i = 0; i < sf.size(); ++i) {
    if (!used[i]) {
      EXPECT_EQ(sf[i], 0) << i;
    }
  }
  w.k = 200;
  EXPECT_THROW(swizzle_weight_sf_sm1xx(w), Error);
  w.k = 256;
  w.format = WeightFormat::MXFP4;
  EXPECT_THROW(swizzle_weight_sf_sm1xx(w), Error);
}
