// The "moe-gemm" tactic registry: our sm_90a kernel (each candidate config), the cuBLAS
// dequant baseline, the Generic fallback, and the Blackwell block-scaled kernels listed for
// feasibility only. Every valid() says why not, with the bytes.
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"  // plain constexpr: the sm90 kernel's carve-up
#include "tuner/blackwell_layout.hpp"
#include "tuner/tactic.hpp"

namespace fp4moe::tuner {
namespace {

namespace sm90 = cuda::sm90;

bool is_fp4(WeightFormat w) { return w == WeightFormat::NVFP4 || w == WeightFormat::MXFP4; }
int fp4_block(WeightFormat w) { return w == WeightFormat::MXFP4 ? 32 : 16; }

std::string smem_reason(const Tactic& t, int64_t need, const ArchInfo& a) {
  return fmt::format("{}x{}x{} x {} stages needs {} B of shared memory; {} allows {} B per block", t.block_m,
                     t.block_n, t.block_k, t.stages, with_commas(need), a.name,
                     with_commas(a.smem_per_block_optin));
}

// ---- sm90-wgmma: the layout comes from cuda/moe_gemm/sm90_tile_layout.hpp, term by term ----

SmemPlan sm90_plan(const Tactic& c, int num_experts) {
  const sm90::Sm90SmemLayout l = sm90::sm90_smem_layout(c.block_n, c.stages, num_experts);
  SmemPlan p;
  p.add("slack to align the base to 1024 B", int64_t(l.align_slack), 1, "dynamic smem base alignment");
  p.add("B: activations (BF16, 128B swizzle)", int64_t(l.b_bytes), sm90::kSwizzleAlign,
        fmt::format("{} x {} tokens x {} K x 2 B", c.stages, c.block_n, sm90::kBlockK));
  p.add("A: weights (E2M1 codes)", int64_t(l.a_bytes), 16,
        fmt::format("{} x {} rows x {} B", c.stages, sm90::kBlockM, sm90::kBlockK / 2));
  p.add("weight scales (E4M3/E8M0)", int64_t(l.scale_bytes), 16,
        fmt::format("{} x {} rows x {}", c.stages, sm90::kBlockM, sm90::kBlockK / 16));
  p.add("mbarriers", int64_t(l.barrier_bytes), 8, fmt::format("{} x (full + empty) x 8 B", c.stages));
  p.add("tile scheduler prefix", int64_t(l.sched_bytes), 16, fmt::format("({} + 3) x 4 B: prefix, split count, split flag", num_experts));
  p.add("epilogue", int64_t(l.epilogue_bytes), 16, "registers straight to global: none");
  return p;
}

// The checks both sm90 kernels share (same chunks, same carve-up): FP4 weights, N / K
// multiples of the tile, the instantiated block_n values, >= 2 stages, and shared memory
// within the per-block limit and, at `ctas` CTAs per SM, within each CTA's share of the SM.
// Returns the bytes needed; `plan` gets the terms.
int64_t sm90_common_checks(const Tactic& t, const GemmProblem& p, const ArchInfo& a, bool block_n_ok,
                           const char* block_ns, int ctas, Feasibility& f, SmemPlan& plan) {
  if (!is_fp4(p.weight)) f.reject(RejectKind::Numerics, "needs FP4 weights (NVFP4 or MXFP4)");
  if (p.n % sm90::kBlockM != 0)
    f.reject(RejectKind::Shape, fmt::format("N = {} is not a multiple of the {}-row weight tile", p.n, sm90::kBlockM));
  if (p.k % sm90::kBlockK != 0) f.reject(RejectKind::Shape, fmt::format("K = {} is not a multiple of {}", p.k, sm90::kBlockK));
  if (!block_n_ok)
    f.reject(RejectKind::Shape, fmt::format("block_n = {} is not instantiated ({})", t.block_n, block_ns));
  if (t.stages < 2) f.reject(RejectKind::Shape, "needs at least 2 pipeline stages");
  plan = sm90_plan(t, p.num_experts);
  const int64_t need = int64_t(sm90::sm90_smem_layout(t.block_n, t.stages, p.num_experts).total);
  FP4MOE_CHECK(plan.total() == need, "tuner's sm90 smem terms ({}) disagree with sm90_tile_layout.hpp ({})",
               plan.total(), need);
  if (need > a.smem_per_block_optin) f.reject(RejectKind::SharedMemory, smem_reason(t, need, a));
  if (ctas > 1 && need <= a.smem_per_block_optin) {
    const int64_t share = a.smem_per_sm / ctas - a.smem_reserved_per_block;
    if (need > share)
      f.reject(RejectKind::SharedMemory,
               fmt::format("{}x{}x{} x {} stages needs {} B; it runs {} CTAs per SM, each may use {} B of {}'s {} B",
                           t.block_m, t.block_n, t.block_k, t.stages, with_commas(need), ctas,
                           with_commas(share), a.name, with_commas(a.smem_per_sm)));
  }
  return need;
}

Feasibility sm90_valid(const Tactic& t, const GemmProblem& p, const ArchInfo& a) {
  Feasibility f;
  if (!a.wgmma) f.reject(RejectKind::Arch, fmt::format("needs wgmma (sm_90a); {} has none", a.name));
  // Configs designed to run several CTAs per SM (block_n 16: 2) must fit their share of the SM.
  SmemPlan plan;
  const int64_t need = sm90_common_checks(t, p, a, sm90::sm90_block_n_supported(t.block_n), "16, 64, 128, 256",
                                          sm90::sm90_ctas_per_sm(t.block_n), f, plan);
  if (sm90::kThreads > a.max_threads_per_block)
    f.reject(RejectKind::Registers, fmt::format("needs {} threads per block; {} allows {}", sm90::kThreads, a.name, a.max_threads_per_block));
  // Register budget: 3 warpgroups share 64 K registers; the consumers hold block_n / 2 FP32
  // accumulators each (64 rows x block_n over 128 threads).
  const int acc_regs = 64 * t.block_n / 128;
  f.notes.push_back(fmt::format("{} FP32 accumulators per consumer thread; {} threads share {} registers "
                                "(avg {} per thread)",
                                acc_regs, sm90::kThreads, a.regs_per_sm, a.regs_per_sm / sm90::kThreads));
  if (need <= a.smem_per_block_optin) {
    const int64_t per_block = need + a.smem_reserved_per_block;
    f.notes.push_back(fmt::format("{} CTA(s) per SM by shared memory ({} + {} reserved of {} B)",
                                  a.smem_per_sm / per_block, with_commas(need), with_commas(a.smem_reserved_per_block),
                                  with_commas(a.smem_per_sm)));
  }
  f.smem = std::move(plan);
  return f;
}

// ---- sm90-decode: the mma.sync weight-streaming kernel, same carve-up, 3 CTAs per SM ----

Feasibility sm90_decode_valid(const Tactic& t, const GemmProblem& p, const ArchInfo& a) {
  Feasibility f;
  if (!a.tma || !a.mma_sync_bf16 || a.cc != 90)
    f.reject(RejectKind::Arch, fmt::format("built for sm_90a only (TMA, mbarrier, mma.sync); {} is not sm_90", a.name));
  const int ctas = sm90::kDecodeCtasPerSm;
  SmemPlan plan;
  sm90_common_checks(t, p, a, sm90::sm90_decode_block_n_supported(t.block_n), "8, 16, 32", ctas, f, plan);
  const int threads = sm90::kDecodeThreads * ctas;
  f.notes.push_back(fmt::format("{} CTAs of {} threads per SM: at most {} registers per thread of {}", ctas,
                                sm90::kDecodeThreads, a.regs_per_sm / threads / 8 * 8, a.regs_per_sm));
  f.notes.push_back(fmt::format("{} FP32 accumulators per consumer thread (16 rows x {} tokens per warp)",
                                t.block_n / 2, t.block_n));
  f.smem = std::move(plan);
  return f;
}

// ---- the baseline and the fallback ----

Feasibility dequant_valid(const GemmProblem& p, const ArchInfo& a) {
  Feasibility f;
  if (a.cc < 80) f.reject(RejectKind::Arch, fmt::format("needs sm_80+ (cuBLASLt BF16); {} is older", a.name));
  if (!is_fp4(p.weight)) f.reject(RejectKind::Numerics, "needs FP4 weights (NVFP4 or MXFP4)");
  if (p.act != ActFormat::BF16) f.reject(RejectKind::Numerics, "computes W4A16 (BF16 activations) only");
  if (p.k % fp4_block(p.weight) != 0)
    f.reject(RejectKind::Shape, fmt::format("K = {} is not a multiple of the {} block {}", p.k, weight_format_name(p.weight),
                         fp4_block(p.weight)));
  f.notes.push_back("cuBLAS needs each expert's M on the host: one device-to-host copy of the counts per call");
  f.notes.push_back("no grouped path: one GEMM per hit expert, plus a dequantize pass over the hit experts' weights");
  return f;
}

Feasibility generic_valid(const GemmProblem& p, const ArchInfo& a) {
  Feasibility f;
  if (a.cc < 80) f.reject(RejectKind::Arch, fmt::format("needs sm_80+ (mma.sync BF16); {} is older", a.name));
  if (!is_fp4(p.weight)) f.reject(RejectKind::Numerics, "needs FP4 weights (NVFP4 or MXFP4)");
  if (p.act != ActFormat::BF16) f.reject(RejectKind::Numerics, "computes W4A16 (BF16 activations) only");
  if (p.k % fp4_block(p.weight) != 0)
    f.reject(RejectKind::Shape, fmt::format("K = {} is not a multiple of the {} block {}", p.k, weight_format_name(p.weight),
                         fp4_block(p.weight)));
  if (p.epilogue == Epilogue::SiluMul && p.n % 2 != 0) f.reject(RejectKind::Shape, fmt::format("SiluMul needs an even N (N = {})", p.n));
  return f;
}

// ---- Blackwell block-scaled (listed only) ----

BsFamily bs_family(GemmKernel i) {
  return i == GemmKernel::Sm100Tcgen05BlockScaled ? BsFamily::Sm100Tcgen05 : BsFamily::Sm120MmaSync;
}

Feasibility bs_valid(const Tactic& t, const GemmProblem& p, const ArchInfo& a) {
  Feasibility f;
  const BsFamily fam = bs_family(t.kernel);
  const BsTile tile{t.block_m, t.block_n, t.block_k};
  if (fam == BsFamily::Sm100Tcgen05 && !a.tcgen05)
    f.reject(RejectKind::Arch, fmt::format("needs tcgen05 block-scaled MMA (sm_100a / sm_103a); {} has none", a.name));
  if (fam == BsFamily::Sm120MmaSync && !a.is_blackwell_geforce())
    f.reject(RejectKind::Arch, fmt::format("needs mma.sync block_scale (sm_120a / sm_121a); {} has none", a.name));
  if (!is_fp4(p.weight)) f.reject(RejectKind::Numerics, "needs FP4 weights (NVFP4 or MXFP4)");
  if (p.act != ActFormat::NVFP4_EMULATED)
    f.reject(RejectKind::Numerics, "computes W4A4 (activations quantized to FP4); this problem is W4A16");
  if (p.n % tile.n != 0) f.reject(RejectKind::Shape, fmt::format("N = {} is not a multiple of the tile N = {}", p.n, tile.n));
  if (p.k % tile.k != 0) f.reject(RejectKind::Shape, fmt::format("K = {} is not a multiple of the tile K = {}", p.k, tile.k));
  if (t.stages < 2) f.reject(RejectKind::Shape, "needs at least 2 pipeline stages");
  const WeightFormat w = is_fp4(p.weight) ? p.weight : WeightFormat::NVFP4;
  SmemPlan plan = bs_smem_plan(fam, tile, t.stages, w);
  const int64_t cap = a.smem_per_block_optin;
  if (plan.total() > cap) {
    std::string r = smem_reason(t, plan.total(), a);
    const int naive = bs_naive_stage_count(fam, tile, w, cap);
    const int aligned = bs_aligned_stage_count(fam, tile, w, cap);
    if (naive == t.stages && aligned < naive)
    {
      const int64_t counted = bs_naive_carveout(fam, tile) + naive * bs_naive_stage_bytes(tile, w, fam);
      r += fmt::format(" (CUTLASS's StageCountAutoCarveout would pick {} stages: it counts {} B and misses {} B of "
                       "alignment padding; {} fit)",
                       naive, with_commas(counted), with_commas(plan.total() - counted), aligned);
    }
    f.reject(RejectKind::SharedMemory, std::move(r));
  }
  const BsCtaShape c = bs_cta_shape(fam, tile);
  if (fam == BsFamily::Sm120MmaSync) {
    // Accumulators live in registers: 2 consumer warpgroups (256 threads) hold the M x N FP32 tile.
    const int acc_regs = tile.m * tile.n / 256;
    if (acc_regs > 192)
      f.reject(RejectKind::Registers, fmt::format("{} FP32 accumulators per consumer thread leave too few of the {} registers",
                           acc_regs, a.regs_per_thread_max));
  } else {
    // Tensor memory: 512 columns of 128 lanes; the accumulator takes N columns per stage.
    const int acc_stages = tile.n == 256 ? 1 : 2;
    const int cols = tile.n * acc_stages;
    if (cols > 512) f.reject(RejectKind::Registers, fmt::format("accumulators need {} TMEM columns; 512 exist", cols));
    if (c.cta_pair == 2) f.notes.push_back("2-SM tile: a CTA pair (cluster 2x1), each CTA holds half of A and B");
  }
  f.notes.push_back("listed for feasibility: not implemented in fp4moe (no Blackwell GPU to run it)");
  f.smem = std::move(plan);
  return f;
}

std::vector<int> bs_stage_list(BsFamily fam, BsTile tile, WeightFormat w, int64_t cap) {
  const int naive = bs_naive_stage_count(fam, tile, w, cap);
  std::set<int> s{2};
  for (int st : {3, 4})
    if (st <= naive) s.insert(st);
  if (naive > 2) s.insert(naive);
  return {s.begin(), s.end()};
}

}  // namespace

std::vector<TacticDef> moe_gemm_tactics(const GemmProblem& p) {
  std::vector<TacticDef> out;
  const int experts = std::max(p.num_experts, 1);
  // Our sm_90a kernel: every instantiated block_n, with the deepest pipeline that fits sm_90's
  // 232,448 B under the kernel's per-block_n cap (16 / 12 / 8 / 6 stages: what
  // cuda::candidate_configs picks), and a 4-stage variant to measure whether depth pays.
  for (int bn : {16, 64, 128, 256}) {
    const int cap = bn <= 16 ? 16 : bn <= 64 ? 12 : bn <= 128 ? 8 : 6;
    const int deepest = sm90::sm90_max_stages(bn, experts, cap);
    std::set<int> stages{4};
    if (deepest >= 2) stages.insert(deepest);
    for (int st : stages) {
      Tactic t{GemmKernel::Sm90Wgmma, sm90::kBlockM, bn, sm90::kBlockK, st, 1, 1};
      out.push_back({t, [t](const GemmProblem& q, const ArchInfo& a) { return sm90_valid(t, q, a); }});
    }
  }
  // The decode kernel: each block_n with the deepest ring its per-CTA share allows (what
  // cuda::candidate_configs picks).
  for (int bn : {8, 16, 32}) {
    const int deepest = sm90::sm90_decode_max_stages(bn, experts, 16);
    Tactic t{GemmKernel::Sm90Decode, sm90::kBlockM, bn, sm90::kBlockK, std::max(deepest, 2), 1, 1};
    out.push_back({t, [t](const GemmProblem& q, const ArchInfo& a) { return sm90_decode_valid(t, q, a); }});
  }
  out.push_back({Tactic{GemmKernel::DequantCublas}, dequant_valid});
  out.push_back({fallback_tactic("moe-gemm"), generic_valid});

  const WeightFormat w = is_fp4(p.weight) ? p.weight : WeightFormat::NVFP4;
  struct Listing {
    GemmKernel kernel;
    int64_t cap;
    std::vector<BsTile> tiles;
  };
  const Listing listings[] = {
      {GemmKernel::Sm100Tcgen05BlockScaled, arch_by_name("sm_100").smem_per_block_optin,
       {{128, 128, 256}, {128, 256, 256}, {256, 128, 256}, {256, 256, 256}}},
      {GemmKernel::Sm120MmaBlockScaled, arch_by_name("sm_120").smem_per_block_optin,
       {{128, 128, 128}, {128, 256, 128}, {256, 128, 128}, {128, 128, 256}, {128, 256, 256}, {256, 128, 256}}},
  };
  for (const Listing& l : listings)
    for (BsTile tile : l.tiles)
      for (int st : bs_stage_list(bs_family(l.kernel), tile, w, l.cap)) {
        Tactic t{l.kernel, tile.m, tile.n, tile.k, st, 1, 1};
        out.push_back({t, [t](const GemmProblem& q, const ArchInfo& a) { return bs_valid(t, q, a); }});
      }
  return out;
}

}  // namespace fp4moe::tuner
