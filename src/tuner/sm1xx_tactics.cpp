// Blackwell tactics from the CUTLASS types' own facts (sm1xx_tactics.hpp). Compiled, not run.
#include "tuner/sm1xx_tactics.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cuda/moe_gemm_sm1xx/sm1xx_bs_kernels.hpp"

namespace fp4moe::tuner {
namespace {

namespace bs = cuda::sm1xx;

std::span<const bs::BsKernelFacts> type_facts() {
#ifdef FP4MOE_HAVE_CUDA
  return bs::bs_type_facts();
#else
  return {};
#endif
}

std::span<const bs::BsKernel> built_kernels() {
#ifdef FP4MOE_HAVE_CUDA
  return bs::bs_kernels();
#else
  return {};
#endif
}

Tactic tactic_of(const bs::BsKernelFacts& f) {
  GemmKernel kernel = GemmKernel::Sm120MmaBlockScaled;
  int cluster = 1;
  switch (f.recipe) {
    case bs::BsRecipe::Sm120Grouped: kernel = GemmKernel::Sm120MmaBlockScaled; break;
    case bs::BsRecipe::Sm100Grouped1Sm: kernel = GemmKernel::Sm100Tcgen05BlockScaled; break;
    case bs::BsRecipe::Sm100Grouped2Sm: kernel = GemmKernel::Sm100Tcgen05BlockScaled; cluster = 2; break;
    case bs::BsRecipe::Sm100MoeDecode: kernel = GemmKernel::Sm100MoeDecodeBlockScaled; break;
  }
  return Tactic{kernel, f.tile_m, f.tile_n, f.tile_k, f.stages, 1, cluster};
}

// A kernel of exactly these types is compiled into this binary.
bool is_built(const bs::BsKernelFacts& f) {
  return std::any_of(built_kernels().begin(), built_kernels().end(), [&](const bs::BsKernel& k) {
    return !f.f32_source && k.facts.recipe == f.recipe && k.facts.tile_m == f.tile_m && k.facts.tile_n == f.tile_n &&
           k.facts.tile_k == f.tile_k && k.facts.stages == f.stages;
  });
}

// The shared storage as its types lay it out (all sizeof() of the CUTLASS structs).
SmemPlan plan_of(const bs::BsKernelFacts& f) {
  SmemPlan p;
  p.add("mainloop: A, B, SFA, SFB rings", f.mainloop_bytes, 1,
        fmt::format("sizeof(CollectiveMainloop::TensorStorage), {} stages", f.stages));
  p.add("epilogue: D staging for the TMA store", f.epilogue_bytes, 1, "sizeof(CollectiveEpilogue::TensorStorage)");
  p.add("pipelines, barriers, tensor maps, scheduler", f.smem_bytes - f.mainloop_bytes - f.epilogue_bytes, 1,
        "the rest of GemmKernel::SharedStorage, alignment included");
  return p;
}

Feasibility sm1xx_valid(const bs::BsKernelFacts& f, bool built, const GemmProblem& p, const ArchInfo& a) {
  Feasibility r;
  const int cc = bs::recipe_cc(f.recipe);
  // Arch-specific ("a") cubins run on exactly that compute capability.
  if (a.cc != cc)
    r.reject(RejectKind::Arch, fmt::format("compiled for sm_{}a ({}), which runs on compute capability {}.{} only; {} is not",
                                           cc, cc == 120 ? "mma.sync block_scale" : "tcgen05 kind::mxf4nvf4", cc / 10,
                                           cc % 10, a.name));
  if (p.weight != WeightFormat::NVFP4)
    r.reject(RejectKind::Numerics, fmt::format("built for NVFP4 (E4M3 scale per 16) weights, not {}", weight_format_name(p.weight)));
  if (p.act != ActFormat::NVFP4_EMULATED)
    r.reject(RejectKind::Numerics, "computes W4A4 (activations quantized to NVFP4 with the input_scale); this problem is W4A16");
  if (p.k % 128 != 0) r.reject(RejectKind::Shape, fmt::format("K = {} is not a multiple of 128", p.k));
  if (p.n % 8 != 0) r.reject(RejectKind::Shape, fmt::format("N = {} is not a multiple of 8 (16-byte BF16 output rows)", p.n));
  if (f.smem_bytes > a.smem_per_block_optin)
    r.reject(RejectKind::SharedMemory,
             fmt::format("{}x{}x{} x {} stages needs {} B of shared memory (sizeof(SharedStorage) of its CUTLASS types); "
                         "{} allows {} B per block",
                         f.tile_m, f.tile_n, f.tile_k, f.stages, with_commas(f.smem_bytes), a.name,
                         with_commas(a.smem_per_block_optin)));
  if (f.threads > a.max_threads_per_block)
    r.reject(RejectKind::Registers, fmt::format("needs {} threads per block; {} allows {}", f.threads, a.name,
                                                a.max_threads_per_block));
  if (r.ok && !built)
    r.reject(RejectKind::NotBuilt, fmt::format("fits ({} of {} B) but is not instantiated in this binary (types only)",
                                               with_commas(f.smem_bytes), with_commas(a.smem_per_block_optin)));
  r.notes.push_back(fmt::format("{} stages {}; {} threads per CTA", f.stages,
                                f.auto_stages ? fmt::format("(StageCountAutoCarveout, assuming the builder's {} B)",
                                                            with_commas(f.builder_capacity))
                                              : "(fixed)",
                                f.threads));
  if (f.recipe == bs::BsRecipe::Sm100Grouped2Sm) r.notes.push_back("2-SM tile: a CTA pair (cluster 2x1) per 256 weight rows");
  if (f.recipe == bs::BsRecipe::Sm100MoeDecode)
    r.notes.push_back("per-expert slabs of max_n token rows (the layer passes its token count): decode only");
  r.notes.push_back("compiled, not run (no Blackwell GPU has executed it)");
  r.smem = plan_of(f);
  return r;
}

}  // namespace

bool sm1xx_facts_available() { return !type_facts().empty(); }

std::string sm1xx_absence_reason() {
  if (sm1xx_facts_available()) return {};
#ifdef FP4MOE_HAVE_CUDA
  return "this binary was built without sm_100a / sm_120a (CMAKE_CUDA_ARCHITECTURES): the Blackwell kernels' "
         "shared memory comes from their CUTLASS types, which were not compiled";
#else
  return "this binary was built without CUDA: the Blackwell kernels' shared memory comes from their CUTLASS types, "
         "which need nvcc";
#endif
}

void append_sm1xx_tactics(const GemmProblem& p, std::vector<TacticDef>& out) {
  std::vector<Tactic> seen;
  for (const bs::BsKernelFacts& f : type_facts()) {
    if (f.f32_source) continue;  // a comparison case (an epilogue with an FP32 C), not a kernel of ours
    const Tactic t = tactic_of(f);
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;  // same types as an earlier row
    seen.push_back(t);
    const bool built = is_built(f);
    out.push_back({t, [f, built](const GemmProblem& q, const ArchInfo& a) { return sm1xx_valid(f, built, q, a); }});
  }
  (void)p;
}

}  // namespace fp4moe::tuner
