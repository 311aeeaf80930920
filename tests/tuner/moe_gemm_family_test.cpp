// The arch -> MoE GEMM kernel family table (tuner/moe_gemm_family.hpp), fed made-up devices:
// which family each compute capability gets, and that every config it selects fits that device's
// shared memory by the kernels' own byte arithmetic (sm90_tile_layout.hpp's carve-up; the CUTLASS
// types' sizeof(SharedStorage)). No GPU: nothing here launches a kernel. The Blackwell configs
// exist only in a CUDA build with sm_100a / sm_120a (CI's default); elsewhere those cases skip.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"
#include "tuner/sm1xx_build.hpp"
#include "tuner/moe_gemm_family.hpp"
#include "tuner/sm1xx_tactics.hpp"

#ifdef FP4MOE_HAVE_CUDA
#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"
#endif

using namespace fp4moe;
using namespace fp4moe::tuner;

namespace {

// What cudaGetDeviceProperties reports for these parts (H200, B200, RTX PRO 6000, L40S).
DeviceProps fake_device(int cc) {
  DeviceProps p;
  p.cc = cc;
  p.regs_per_sm = p.regs_per_block = 65536;
  p.max_threads_per_block = 1024;
  p.max_blocks_per_sm = 32;
  switch (cc) {
    case 90: p.name = "NVIDIA H200 (made up)"; p.smem_per_sm = 233472; p.sm_count = 132; p.max_threads_per_sm = 2048; break;
    case 100: p.name = "NVIDIA B200 (made up)"; p.smem_per_sm = 233472; p.sm_count = 148; p.max_threads_per_sm = 2048; break;
    case 120: p.name = "RTX PRO 6000 (made up)"; p.smem_per_sm = 102400; p.sm_count = 188; p.max_threads_per_sm = 1536; break;
    default: p.name = "NVIDIA L40S (made up)"; p.smem_per_sm = 102400; p.sm_count = 142; p.max_threads_per_sm = 1536; p.max_blocks_per_sm = 24;
  }
  p.smem_reserved_per_block = 1024;
  p.smem_per_block_optin = p.smem_per_sm - p.smem_reserved_per_block;
  return p;
}

GemmProblem glm5(bool gate_up) {
  GemmProblem p;
  p.num_experts = 256;
  p.n = gate_up ? 4096 : 6144;
  p.k = gate_up ? 6144 : 2048;
  p.top_k = 8;
  p.weight = WeightFormat::NVFP4;
  p.epilogue = gate_up ? Epilogue::SiluMul : Epilogue::RowScale;
  p.label = gate_up ? "gate_up" : "down";
  return p;
}

const std::vector<CompiledArch> kCi = parse_cuda_archs("90a;100a;120a");  // CMakeLists.txt's default

#ifdef FP4MOE_HAVE_CUDA
namespace bs = cuda::sm1xx;
// sizeof(GemmKernel::SharedStorage) of the built kernel behind a Blackwell tactic.
int64_t cutlass_smem_bytes(const Tactic& t) {
  const bs::BsRecipe r = t.kernel == GemmKernel::Sm120MmaBlockScaled         ? bs::BsRecipe::Sm120Grouped
                        : t.kernel == GemmKernel::Sm100MoeDecodeBlockScaled ? bs::BsRecipe::Sm100MoeDecode
                        : t.cluster == 2                                     ? bs::BsRecipe::Sm100Grouped2Sm
                                                                             : bs::BsRecipe::Sm100Grouped1Sm;
  for (const bs::BsKernel& k : bs::bs_kernels()) {
    const bs::BsKernelFacts& f = k.facts;
    if (f.recipe == r && f.tile_m == t.block_m && f.tile_n == t.block_n && f.tile_k == t.block_k && f.stages == t.stages)
      return f.smem_bytes;
  }
  return -1;
}
bool have_kernels(int cc) {
  return std::any_of(bs::bs_kernels().begin(), bs::bs_kernels().end(),
                     [&](const bs::BsKernel& k) { return bs::recipe_cc(k.facts.recipe) == cc; });
}
#else
int64_t cutlass_smem_bytes(const Tactic&) { return -1; }
bool have_kernels(int) { return false; }
#endif

}  // namespace

TEST(CudaArchList, ParsesCmakeEntriesAndWhichDevicesTheirCodeLoadsOn) {
  const std::vector<CompiledArch> a = parse_cuda_archs("90a;100a;120a");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].cc, 90);
  EXPECT_TRUE(a[0].arch_specific && a[1].arch_specific && a[2].arch_specific);
  EXPECT_TRUE(a[0].runs_on(90));
  EXPECT_FALSE(a[0].runs_on(89));
  EXPECT_FALSE(a[0].runs_on(100));  // arch-specific cubins and PTX: that arch only
  const std::vector<CompiledArch> b = parse_cuda_archs("80,86-real,89-virtual,100f");
  ASSERT_EQ(b.size(), 4u);
  EXPECT_TRUE(b[0].runs_on(80) && b[0].runs_on(86) && b[0].runs_on(120));  // SASS for 8.x, PTX beyond
  EXPECT_TRUE(b[1].runs_on(89));
  EXPECT_FALSE(b[1].runs_on(90));  // SASS only: same major
  EXPECT_FALSE(b[2].sass);
  EXPECT_TRUE(b[2].runs_on(90));   // PTX: any later arch
  EXPECT_FALSE(b[2].runs_on(86));
  EXPECT_TRUE(b[3].family_specific && b[3].runs_on(103));
  EXPECT_FALSE(b[3].runs_on(120));
  EXPECT_TRUE(parse_cuda_archs("").empty());
  EXPECT_THROW(parse_cuda_archs("90a;sm_100"), Error);
}

TEST(CudaArchList, ThisBinarysListAgreesWithItsPerArchDefines) {
  const auto has = [](int cc) {
    for (const CompiledArch& c : compiled_cuda_archs())
      if (c.cc == cc && c.arch_specific) return true;
    return false;
  };
#ifdef FP4MOE_HAVE_CUDA
  EXPECT_FALSE(compiled_cuda_archs().empty()) << compiled_cuda_archs_text();
#else
  EXPECT_TRUE(compiled_cuda_archs().empty());
#endif
#ifdef FP4MOE_HAVE_SM90
  EXPECT_TRUE(has(90)) << compiled_cuda_archs_text();
#else
  EXPECT_FALSE(has(90)) << compiled_cuda_archs_text();
#endif
#ifdef FP4MOE_HAVE_SM100
  EXPECT_TRUE(has(100)) << compiled_cuda_archs_text();
#else
  EXPECT_FALSE(has(100)) << compiled_cuda_archs_text();
#endif
#ifdef FP4MOE_HAVE_SM120
  EXPECT_TRUE(has(120)) << compiled_cuda_archs_text();
#else
  EXPECT_FALSE(has(120)) << compiled_cuda_archs_text();
#endif
}

TEST(DeviceArch, ReportedLimitsOverrideTheTable) {
  DeviceProps p = fake_device(120);
  p.smem_per_block_optin = 90000;  // a made-up part with less shared memory than the table's
  const ArchInfo a = arch_of_device(p);
  EXPECT_EQ(a.name, "sm_120");
  EXPECT_EQ(a.source, "device");
  EXPECT_EQ(a.smem_per_block_optin, 90000);
  EXPECT_EQ(a.sm_count, 188);
  EXPECT_TRUE(a.block_scaled_mma);
  EXPECT_FALSE(a.wgmma);
  const ArchInfo u = arch_of_device(fake_device(75));  // not in the table: the device's numbers only
  EXPECT_EQ(u.name, "sm_75");
  EXPECT_FALSE(u.mma_sync_bf16);
}

TEST(MoeGemmFamily, Sm90DeviceGetsTheSm90KernelsEachWithinItsSharedMemoryShare) {
  const ArchInfo a = arch_of_device(fake_device(90));
  for (bool gate_up : {true, false}) {
    const FamilyChoice c = select_moe_gemm_family(a, glm5(gate_up), kCi);
    EXPECT_EQ(c.family, MoeGemmFamily::Sm90) << c.why;
    EXPECT_EQ(c.act, ActFormat::BF16);
    ASSERT_FALSE(c.configs.empty());
    bool wgmma = false, decode = false;
    for (const FamilyConfig& f : c.configs) {
      const Tactic& t = f.tactic;
      ASSERT_TRUE(t.kernel == GemmKernel::Sm90Wgmma || t.kernel == GemmKernel::Sm90Decode) << tactic_name(t);
      wgmma |= t.kernel == GemmKernel::Sm90Wgmma;
      decode |= t.kernel == GemmKernel::Sm90Decode;
      // The kernel's own carve-up, and the share of the SM each of its resident CTAs gets.
      const int64_t need = int64_t(cuda::sm90::sm90_smem_layout(t.block_n, t.stages, 256).total);
      EXPECT_EQ(f.smem_bytes, need) << tactic_name(t);
      const int ctas = t.kernel == GemmKernel::Sm90Decode ? cuda::sm90::kDecodeCtasPerSm : cuda::sm90::sm90_ctas_per_sm(t.block_n);
      EXPECT_LE(need, a.smem_per_block_optin) << tactic_name(t);
      EXPECT_LE(need, a.smem_per_sm / ctas - a.smem_reserved_per_block) << tactic_name(t) << " at " << ctas << " CTAs/SM";
    }
    EXPECT_TRUE(wgmma && decode);
  }
  // W4A4 on request: the sm90 family emulates it.
  EXPECT_EQ(select_moe_gemm_family(a, glm5(true), kCi, true).act, ActFormat::NVFP4_EMULATED);
}

TEST(MoeGemmFamily, Sm120DeviceGetsTheCutlassBlockScaledKernelsWithin99KB) {
  if (!have_kernels(120)) FP4MOE_SKIP_UNLESS_BUILT_FOR(120);
  ASSERT_TRUE(have_kernels(120)) << "built for sm_120a but no kernel of it is registered";
  const ArchInfo a = arch_of_device(fake_device(120));
  ASSERT_EQ(a.smem_per_block_optin, 101376);
  for (bool gate_up : {true, false}) {
    const FamilyChoice c = select_moe_gemm_family(a, glm5(gate_up), kCi);
    EXPECT_EQ(c.family, MoeGemmFamily::Sm1xx) << c.why;
    EXPECT_EQ(c.act, ActFormat::NVFP4_EMULATED);  // the kernels' numerics: W4A4
    ASSERT_FALSE(c.configs.empty());
    for (const FamilyConfig& f : c.configs) {
      EXPECT_EQ(f.tactic.kernel, GemmKernel::Sm120MmaBlockScaled) << tactic_name(f.tactic);
      EXPECT_EQ(f.smem_bytes, cutlass_smem_bytes(f.tactic)) << tactic_name(f.tactic);
      EXPECT_GT(f.smem_bytes, 0);
      EXPECT_LE(f.smem_bytes, a.smem_per_block_optin) << tactic_name(f.tactic);
    }
  }
  // The filter is the arithmetic: on a made-up sm_120 part with 90,000 B per block exactly the
  // built configs whose SharedStorage fits 90,000 B remain.
  DeviceProps small = fake_device(120);
  small.smem_per_block_optin = 90000;
  const ArchInfo s = arch_of_device(small);
  const FamilyChoice full = select_moe_gemm_family(a, glm5(true), kCi), cut = select_moe_gemm_family(s, glm5(true), kCi);
  size_t fit = 0;
  for (const FamilyConfig& f : full.configs) fit += f.smem_bytes <= 90000 ? 1 : 0;
  if (fit == 0) {
    EXPECT_EQ(cut.family, MoeGemmFamily::Generic) << cut.why;
  } else {
    EXPECT_EQ(cut.family, MoeGemmFamily::Sm1xx);
    EXPECT_EQ(cut.configs.size(), fit);
    for (const FamilyConfig& f : cut.configs) EXPECT_LE(f.smem_bytes, 90000) << tactic_name(f.tactic);
  }
}

TEST(MoeGemmFamily, Sm100DeviceGetsTheTcgen05BlockScaledKernels) {
  if (!have_kernels(100)) FP4MOE_SKIP_UNLESS_BUILT_FOR(100);
  ASSERT_TRUE(have_kernels(100)) << "built for sm_100a but no kernel of it is registered";
  const ArchInfo a = arch_of_device(fake_device(100));
  for (bool gate_up : {true, false}) {
    const FamilyChoice c = select_moe_gemm_family(a, glm5(gate_up), kCi);
    EXPECT_EQ(c.family, MoeGemmFamily::Sm1xx) << c.why;
    ASSERT_FALSE(c.configs.empty());
    for (const FamilyConfig& f : c.configs) {
      EXPECT_TRUE(f.tactic.kernel == GemmKernel::Sm100Tcgen05BlockScaled ||
                  f.tactic.kernel == GemmKernel::Sm100MoeDecodeBlockScaled)
          << tactic_name(f.tactic);
      EXPECT_EQ(f.smem_bytes, cutlass_smem_bytes(f.tactic)) << tactic_name(f.tactic);
      EXPECT_LE(f.smem_bytes, a.smem_per_block_optin) << tactic_name(f.tactic);
    }
  }
}

TEST(MoeGemmFamily, Sm89DeviceGetsGenericWhenTheBinaryRunsOnItElseOneRebuildLine) {
  const ArchInfo a = arch_of_device(fake_device(89));
  const FamilyChoice g = select_moe_gemm_family(a, glm5(true), parse_cuda_archs("89;90a"));
  EXPECT_EQ(g.family, MoeGemmFamily::Generic) << g.why;
  ASSERT_EQ(g.configs.size(), 1u);
  EXPECT_EQ(g.configs[0].tactic.kernel, GemmKernel::Generic);
  const FamilyChoice n = select_moe_gemm_family(a, glm5(true), kCi);
  EXPECT_EQ(n.family, MoeGemmFamily::None);
  EXPECT_TRUE(n.configs.empty());
  EXPECT_NE(n.why.find("sm_89"), std::string::npos) << n.why;
  EXPECT_NE(n.why.find("-DCMAKE_CUDA_ARCHITECTURES=89"), std::string::npos) << n.why;
  EXPECT_EQ(n.why.find('\n'), std::string::npos) << n.why;
}

TEST(MoeGemmFamily, ArchWhoseKernelsAreNotCompiledGivesOneLineOrTheFallback) {
  const ArchInfo b = arch_of_device(fake_device(120));
  // Built for sm_90a only: nothing in the binary loads on sm_120.
  const FamilyChoice n = select_moe_gemm_family(b, glm5(true), parse_cuda_archs("90a"));
  EXPECT_EQ(n.family, MoeGemmFamily::None);
  EXPECT_NE(n.why.find("-DCMAKE_CUDA_ARCHITECTURES=120a"), std::string::npos) << n.why;
  EXPECT_EQ(n.why.find('\n'), std::string::npos) << n.why;
  // Built for plain 120 (no arch-specific cubin): the generic code runs, the CUTLASS kernels do not.
  const FamilyChoice g = select_moe_gemm_family(b, glm5(true), parse_cuda_archs("90a;120"));
  EXPECT_EQ(g.family, MoeGemmFamily::Generic) << g.why;
  EXPECT_NE(g.why.find("need 120a"), std::string::npos) << g.why;
  // sm_90 in a binary without 90a.
  const FamilyChoice h = select_moe_gemm_family(arch_of_device(fake_device(90)), glm5(true), parse_cuda_archs("120a"));
  EXPECT_EQ(h.family, MoeGemmFamily::None);
  EXPECT_NE(h.why.find("90a"), std::string::npos) << h.why;
}

TEST(MoeGemmFamily, ShapeOrFormatTheArchsFamilyCannotTakeFallsBackToGeneric) {
  GemmProblem odd = glm5(true);
  odd.n = 4000;  // not a multiple of the 128-row weight tile
  const FamilyChoice c = select_moe_gemm_family(arch_of_device(fake_device(90)), odd, kCi);
  EXPECT_EQ(c.family, MoeGemmFamily::Generic) << c.why;
  EXPECT_NE(c.why.find("no config of"), std::string::npos) << c.why;
  if (have_kernels(120)) {
    GemmProblem mx = glm5(true);
    mx.weight = WeightFormat::MXFP4;  // the block-scaled kernels are NVFP4 only
    const FamilyChoice m = select_moe_gemm_family(arch_of_device(fake_device(120)), mx, kCi);
    EXPECT_EQ(m.family, MoeGemmFamily::Generic) << m.why;
  }
}
