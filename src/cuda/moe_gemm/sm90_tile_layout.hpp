// Shared-memory carve-up and weight-tile byte layout of the sm_90a NVFP4/MXFP4 grouped GEMM
// (sm90_nvfp4_grouped_gemm.cuh). The SINGLE source of truth: the kernel carves its dynamic
// shared memory with these numbers, and the tuner calls the same functions for feasibility.
// Plain constexpr C++ (no CUDA types): usable on the host, the device and in CPU-only builds.
//
// CTA = 2 consumer warpgroups (threads 0..255), each owning 64 weight rows (the wgmma M
// side) of the 128-row tile, then the producer (one thread issues the TMA / bulk copies):
// a warpgroup at 1 CTA per SM, a single warp at 2 (sm90_threads, sm90_ctas_per_sm).
// Per pipeline stage (one 64-wide K slice):
//   B  (activations) block_n x 64 BF16, K-major, 128-byte swizzled, 1024-byte aligned
//      -> all B stages first, contiguous (block_n * 128 B is a multiple of 1024: no padding)
//   A  (FP4 weights + scales) one re-laid 4608-byte chunk copied by one cp.async.bulk:
//      4096 B of E2M1 codes (128 rows x 64 K / 2) then 512 B of scales (128 rows x 4)
//   barriers: full + empty mbarrier, 8 B each
// plus the tile scheduler's state ((E + 3) x 4 B: the per-expert prefix of tile counts, the
// split-K factor the CTAs agreed on, the split-K "last arrival" flag) and 1024 B of
// slack to align the dynamic shared-memory base to 1024 B. The epilogue writes registers
// straight to global memory (bf16x2 stores): it needs no shared memory.
//
// Weight tile chunk (global memory, [E, N/128, K/64] chunks of kChunkBytes): thread `tid`
// (0..127) of consumer warpgroup `wg` (0..1) — consumer warp w = 4 wg + tid / 32 of the
// decode kernel — reads 16 B of codes at (wg * 128 + tid) * 16 = 4 x 32-bit words, one per
// 16-wide K step (ks = 0..3). Word ks holds the 8 E2M1 codes of that thread's A fragment
// (rows r0 = g, r1 = g + 8 of its warp's 16 rows, g = lane / 4, t = lane % 4; columns 2t,
// 2t+1, 2t+8, 2t+9 of the K step): fragment register j (j = 0..3: {r0, c2t}, {r1, c2t},
// {r0, c2t+8}, {r1, c2t+8}) takes its low bf16 from column c and its high bf16 from c + 1;
// where each code's 4 bits sit in the word is sm90_fp4_word.hpp's (fp4_word_bit).
// Scales: 4096 + ((wg * 4 + warp) * 8 + g) * 8: 8 bytes = for ks = 0..3: {scale(r0), scale(r1)}
// (shared by the 4 threads of a quad: broadcast loads). MXFP4's one scale per 32 is stored
// once per 16 (duplicated) so both formats share the layout.
// Scale byte c (both formats decode with the same two instructions: PRMT, IMAD):
//   the decode's BF16 block scale S = c * kScaleMul + kScaleAdd (per bf16 half), where
//   NVFP4: S = bf16(|scale| * 2^119) (exact), c = (S - 0x7000) / 16, c in [104, 246];
//   MXFP4: S = 2^(e - 127) * 2^119 as bf16 = (e + 119) << 7, c = e (E8M0 byte).
// Fragment row -> weight row (the re-layout chooses it; the epilogue relies on it):
//   plain (None / RowScale): row = 128 * tile + 64 * wg + 16 * warp + 2 * g + h (h = 0 for r0,
//     1 for r1), so a thread holds two ADJACENT output features: bf16x2 stores.
//   SiluMul (N = 2I): output feature f = 64 * tile + 32 * wg + 8 * warp + g; r0 is gate row f,
//     r1 is up row I + f: SiLU(gate) * up is computed in registers, y is [M, I].
#pragma once

#include <cstddef>
#include <cstdint>

namespace fp4moe::cuda::sm90 {

inline constexpr int kBlockM = 128;             // weight rows per CTA tile
inline constexpr int kBlockK = 64;              // K per pipeline stage (4 wgmma k16 steps)
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);  // at 1 CTA per SM (sm90_threads)
inline constexpr int kCodeBytes = kBlockM * kBlockK / 2;        // 4096
inline constexpr int kScaleBytes = kBlockM * (kBlockK / 16);    // 512
inline constexpr int kChunkBytes = kCodeBytes + kScaleBytes;    // 4608
inline constexpr int kSwizzleAlign = 1024;      // 128-byte swizzle atom (8 rows x 128 B)
inline constexpr size_t kSm90MaxSmemPerBlock = 232448;  // 227 KB opt-in limit of sm_90
inline constexpr int kEpilogueScaleLog2 = 7;    // decode yields value * 2^-7: see the .cuh
// Scale byte -> BF16 bits of the decode's block scale (see the chunk layout above).
inline constexpr uint32_t kScaleMulNvfp4 = 16, kScaleAddNvfp4 = 0x7000;
inline constexpr uint32_t kScaleMulMxfp4 = 128, kScaleAddMxfp4 = 0x3B80;  // (e + 119) << 7

constexpr size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Sm90SmemLayout {
  int block_n = 0, stages = 0, num_experts = 0;
  // bytes per term
  size_t align_slack = 0;   // to align the dynamic smem base to 1024 B
  size_t b_bytes = 0;       // all stages of activations
  size_t a_bytes = 0;       // all stages of FP4 codes
  size_t scale_bytes = 0;   // all stages of scales
  size_t barrier_bytes = 0; // full + empty per stage
  size_t sched_bytes = 0;   // per-expert tile prefix [E + 1], split count, split-K flag
  size_t epilogue_bytes = 0;
  // offsets from the aligned base
  size_t b_offset = 0, chunk_offset = 0, barrier_offset = 0, sched_offset = 0;
  size_t total = 0;         // dynamic shared memory to request (includes align_slack)

  constexpr size_t b_stage_bytes() const { return size_t(block_n) * kBlockK * 2; }
};

constexpr Sm90SmemLayout sm90_smem_layout(int block_n, int stages, int num_experts) {
  Sm90SmemLayout l{};
  l.block_n = block_n;
  l.stages = stages;
  l.num_experts = num_experts;
  l.align_slack = kSwizzleAlign;
  l.b_bytes = size_t(stages) * size_t(block_n) * kBlockK * 2;
  l.a_bytes = size_t(stages) * kCodeBytes;
  l.scale_bytes = size_t(stages) * kScaleBytes;
  l.barrier_bytes = size_t(stages) * 2 * 8;
  l.sched_bytes = align_up(size_t(num_experts + 3) * 4, 16);
  l.epilogue_bytes = 0;
  l.b_offset = 0;
  l.chunk_offset = l.b_offset + l.b_bytes;  // 1024-aligned: block_n * 128 B per stage
  l.barrier_offset = l.chunk_offset + l.a_bytes + l.scale_bytes;
  l.sched_offset = l.barrier_offset + l.barrier_bytes;
  l.total = l.align_slack + l.sched_offset + l.sched_bytes + l.epilogue_bytes;
  return l;
}

// CTAs resident per SM: block_n 16 (the weight-streaming decode config) runs two CTAs per
// SM (twice the decoding warps in flight, no setmaxnreg), the others one.
constexpr int sm90_ctas_per_sm(int block_n) { return block_n <= 16 ? 2 : 1; }
inline constexpr size_t kSm90SmemPerSm = 233472;      // 228 KB per SM ...
inline constexpr size_t kSm90ReservedSmemPerCta = 1024;  // ... of which 1 KB per CTA is reserved
// Shared memory one CTA of this block_n may use.
constexpr size_t sm90_smem_limit(int block_n) {
  return sm90_ctas_per_sm(block_n) == 1 ? kSm90MaxSmemPerBlock
                                        : kSm90SmemPerSm / sm90_ctas_per_sm(block_n) - kSm90ReservedSmemPerCta;
}

// Threads per CTA: 2 consumer warpgroups, then the producer: a whole warpgroup (so that
// setmaxnreg can move its registers to the consumers) at 1 CTA per SM, one warp at 2.
constexpr int sm90_threads(int block_n) { return 128 * kConsumerWarpgroups + (sm90_ctas_per_sm(block_n) == 1 ? 128 : 32); }

// Valid block_n values (one kernel instantiation each).
constexpr bool sm90_block_n_supported(int block_n) {
  return block_n == 16 || block_n == 64 || block_n == 128 || block_n == 256;
}

// Largest stage count (<= max_stages) that fits `smem_limit`; 0 if even 2 stages do not.
constexpr int sm90_max_stages(int block_n, int num_experts, int max_stages = 16) {
  for (int s = max_stages; s >= 2; --s)
    if (sm90_smem_layout(block_n, s, num_experts).total <= sm90_smem_limit(block_n)) return s;
  return 0;
}

// Split-K, for launches whose tiles cannot fill the GPU. The launcher (sm90_launch_params.cuh)
// allows it only where the upper bound of (expert, token tile, row tile) tiles is below the SM
// count (e.g. one expert's 32-48 row tiles: a separate or folded shared expert's own launch);
// the H200 split sweep measured splitting 256-432 decode tiles over 396 CTA slots slower or
// flat (bench/RESULTS.md). Then the kernel picks S <= kSm90MaxSplits on the device from the
// tile count (no host sync); each (tile, split) unit writes its FP32 accumulators to the
// workspace, the last unit of a tile (per-tile counter) sums the S partials in split order
// (deterministic) and runs the epilogue. Only block_n <= 128 (wider tiles always fill the GPU).
inline constexpr int kSm90MaxSplits = 8;
inline constexpr size_t kSm90SplitPartialBudget = size_t(16) << 20;  // bytes of FP32 partials
constexpr bool sm90_split_k_capable(int block_n) { return block_n <= 128; }
constexpr size_t sm90_split_unit_bytes(int block_n) { return size_t(kBlockM) * size_t(block_n) * 4; }
// Units (tile x split) the partial buffer holds = the per-tile counters' count.
constexpr int sm90_split_cap_units(int block_n) { return int(kSm90SplitPartialBudget / sm90_split_unit_bytes(block_n)); }
// Workspace bytes of the split-K state: partials, then one int counter per unit slot.
constexpr size_t sm90_split_workspace_bytes(int block_n) {
  return sm90_split_k_capable(block_n) ? kSm90SplitPartialBudget + size_t(sm90_split_cap_units(block_n)) * 4 : 0;
}

// ---- the mma.sync decode kernel (sm90_nvfp4_grouped_gemm_decode.cuh) ----
// Same chunks, same carve-up (sm90_smem_layout), same 128-row tile: 8 consumer warps of 16
// rows each (mma.sync m16n8k16, B = the token tile by ldmatrix) and one producer warp, several
// CTAs per SM. Tokens per tile: 8, 16 or 32 (1, 2 or 4 n8 blocks).
inline constexpr int kDecodeConsumerWarps = 8;
inline constexpr int kDecodeThreads = 32 * (kDecodeConsumerWarps + 1);
inline constexpr int kDecodeCtasPerSm = 3;
constexpr bool sm90_decode_block_n_supported(int block_n) { return block_n == 8 || block_n == 16 || block_n == 32; }
constexpr size_t sm90_decode_smem_limit() { return kSm90SmemPerSm / kDecodeCtasPerSm - kSm90ReservedSmemPerCta; }
constexpr int sm90_decode_max_stages(int block_n, int num_experts, int max_stages = 16) {
  for (int s = max_stages; s >= 2; --s)
    if (sm90_smem_layout(block_n, s, num_experts).total <= sm90_decode_smem_limit()) return s;
  return 0;
}
static_assert(sm90_smem_layout(8, 2, 1).b_stage_bytes() % kSwizzleAlign == 0);

// Weight bytes of one expert in the re-laid layout.
constexpr size_t sm90_expert_tile_bytes(int n, int k) {
  return size_t(n / kBlockM) * size_t(k / kBlockK) * kChunkBytes;
}

static_assert(sm90_smem_layout(256, 6, 256).total <= kSm90MaxSmemPerBlock);
static_assert(sm90_smem_layout(16, 16, 256).chunk_offset % kSwizzleAlign == 0);

}  // namespace fp4moe::cuda::sm90
