// Shared memory of the Blackwell block-scaled FP4 GEMMs that fp4moe LISTS but does not run
// (no Blackwell GPU here: "compiled, not run" does not even apply; these are feasibility
// models). They follow CUTLASS's kernels so that the tuner can say which tile configs a
// CUTLASS-style grouped GEMM could use on sm_100 / sm_120, and why not:
//
//   sm_100/103: tcgen05.mma kind::mxf4nvf4, accumulators in tensor memory, 1-SM tiles
//               (M = 128) and 2-SM tiles (M = 256: a CTA pair, each CTA holds half of A and B).
//   sm_120/121: mma.sync ...kind::mxf4nvf4.block_scale, accumulators in registers, TMA loads,
//               no clusters (CUTLASS: "no programmatic multicast on this arch").
//
// CUTLASS orientation: A = activations [tokens, K] (FP4, W4A4), B = weights [N, K] (FP4);
// tile M = tokens, N = weight rows, K elements. Shared storage per CTA, in order:
//   mainloop tensors (alignas 1024: A ring, B ring; then SFA and SFB rings, the scale factors
//   laid out in 128-row x 4-SF atoms (512 B), rows padded to 128, SF per row padded to 4;
//   NVFP4: one E4M3 per 16 elements, MXFP4: one UE8M0 per 32), the struct rounded to 1024;
//   mainloop mbarriers (full + empty: 2 x 8 B per stage), the struct rounded to 1024;
//   epilogue (alignas 1024: 2 stages of a min(M,128) x 32 BF16 tile for the TMA store, plus
//   its barriers), rounded to 1024;
//   kernel extras (tensor maps for the grouped kernel, scheduler pipelines, TMEM bookkeeping),
//   the whole rounded to 1024.
#pragma once

#include "format/moe_layer.hpp"
#include "tuner/arch.hpp"
#include "tuner/smem_plan.hpp"

namespace fp4moe::tuner {

enum class BsFamily : uint8_t { Sm100Tcgen05, Sm120MmaSync };

struct BsTile {
  int m = 0, n = 0, k = 0;  // CUTLASS tile: tokens x weight rows x K elements
};

// The byte-exact shared storage of `stages` stages.
SmemPlan bs_smem_plan(BsFamily fam, BsTile t, int stages, WeightFormat w);

// Bytes per pipeline stage as CUTLASS's sm100_compute_stage_count_or_override_blockscaled
// counts them: A + B + SFA + SFB + one PipelineTmaUmmaAsync<1> (16 B).
int64_t bs_naive_stage_bytes(BsTile t, WeightFormat w, BsFamily fam);
// The bytes CUTLASS subtracts before dividing: the kernel carve-out (scheduler pipelines,
// tensor maps, TMEM bookkeeping) + StageCountAutoCarveout<sizeof(epilogue SharedStorage)>.
int64_t bs_naive_carveout(BsFamily fam, BsTile t);

// CUTLASS's StageCountAutoCarveout count: (capacity - carve-out) / stage bytes. It ignores the
// alignment padding of the 1024 B aligned shared storage (up to ~1 KB per struct), so it can
// pick one stage more than fits; the kernel then fails at start-up when
// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) is refused (NVIDIA/cutlass#3096, #3144:
// "MoE grouped GEMM requires 102400 bytes shared memory but device supports 101376").
int bs_naive_stage_count(BsFamily fam, BsTile t, WeightFormat w, int64_t capacity);
// The count that really fits: the largest s with bs_smem_plan(s).total() <= capacity (0: none).
int bs_aligned_stage_count(BsFamily fam, BsTile t, WeightFormat w, int64_t capacity);

// Scale-factor bytes of one stage of `rows` rows (128 x 4 atoms).
int64_t bs_sf_stage_bytes(int rows, int k, WeightFormat w);

// Per-CTA shape: 2-SM tiles (sm_100, M = 256) split A and B across the CTA pair.
struct BsCtaShape {
  int a_rows, b_rows, sfa_rows, sfb_rows, epi_rows;
  int cta_pair;
};
BsCtaShape bs_cta_shape(BsFamily fam, BsTile t);

}  // namespace fp4moe::tuner
