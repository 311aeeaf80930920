// sm_90a grouped GEMM for MoE experts with NVFP4 / MXFP4 weights, for few tokens per expert
// (decode): the weight-streaming variant of sm90_nvfp4_grouped_gemm.cuh on warp-level
// mma.sync instead of wgmma. Same re-laid weights, same producer, schedule, split-K and
// epilogue (sm90_grouped_common.cuh); only the consumer differs:
//
//   per 64-wide K stage and consumer warp (16 weight rows):
//     codes (16 B) + scales (8 B) by two shared loads, the token tile's B fragments by
//     ldmatrix (kBlockN / 8 n8 blocks x 2), decode 4 K steps to BF16 registers (the A
//     fragments), 4 x kBlockN / 8 mma.sync.m16n8k16, one arrive on the slot's `empty` barrier.
//
// Why not wgmma here: at 1..32 tokens per expert the kernel streams weight bytes and is bound
// by the consumers' instruction issue (the integer pipe first). A wgmma K stage also pays
// per-instruction descriptors (R2UR), warpgroup fences and waits, and keeps 4 warps in step;
// mma.sync takes B from registers, needs no descriptors, and each warp runs on its own, so
// more of the issue slots decode weights, and the small accumulators (kBlockN / 2 floats) let
// three CTAs share an SM (24 decoding warps instead of 16).
#pragma once

#include <cstdint>

#include "cuda/moe_gemm/sm90_grouped_common.cuh"

namespace fp4moe::cuda::sm90 {

template <int kBlockN>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeCtasPerSm)
    sm90_fp4_grouped_gemm_decode_kernel(const __grid_constant__ CUtensorMap tmap_x, const GroupedGemmParams p) {
  static_assert(sm90_decode_block_n_supported(kBlockN));
  constexpr int kNB = kBlockN / 8;            // n8 blocks per token tile
  constexpr int kAcc = kBlockN / 2;           // 4 floats per n8 block
  constexpr int kSets = kNB == 1 ? 2 : 1;     // n8: even / odd K steps accumulate apart (2 chains)
  const Sm90SmemLayout L = sm90_smem_layout(kBlockN, p.stages, p.num_experts);
  extern __shared__ uint8_t smem_raw[];
  const Sm90Smem sm = carve_smem(smem_raw, L);
  const Sm90Schedule sched = schedule_prologue<kBlockN>(p, sm, kDecodeConsumerWarps, &tmap_x);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == kDecodeConsumerWarps) {  // the producer warp: one thread issues the copies
    if (lane == 0) produce<kBlockN>(p, &tmap_x, sm, sched);
    return;
  }

  const int row_tiles = p.n / kBlockM;
  const int k_tiles = p.k / kBlockK;
  const int g = lane / 4;
  const bool mx_fmt = p.mxfp4 != 0;
  // Loop invariants are pinned in registers (opaque to ptxas, which otherwise recomputes
  // them inside the K loop to save registers it does not need to save here).
  uint32_t s_mul = mx_fmt ? kScaleMulMxfp4 : kScaleMulNvfp4;
  uint32_t s_add = (mx_fmt ? kScaleAddMxfp4 : kScaleAddNvfp4) * 0x00010001u;
  // This thread's codes / scales in slot 0's chunk (warp w = rows 16 w .. 16 w + 15 of the tile).
  uint32_t code_addr0 = smem_u32(sm.chunk) + uint32_t(warp * 32 + lane) * 16;
  uint32_t scale_addr0 = smem_u32(sm.chunk) + uint32_t(kCodeBytes + (warp * 8 + g) * 8);
  // ldmatrix rows: lane -> row r = lane % 8 of matrix q = lane / 8; matrix q of load j is the
  // 16-byte column chunk 4 j + q (K 32 j + 8 q ..) of token row r, 128-byte swizzled as TMA
  // wrote it (chunk index ^ row % 8): load 1's address is load 0's with bit 6 flipped. n8
  // block nb adds 8 rows = 1024 B.
  const int r8 = lane & 7, q = lane >> 3;
  uint32_t b_addr0 = smem_u32(sm.b) + uint32_t(r8 * 128 + ((q ^ r8) << 4));
  uint32_t full_addr0 = smem_u32(sm.full), empty_addr0 = smem_u32(sm.empty);
  for (uint32_t* v : {&s_mul, &s_add, &code_addr0, &scale_addr0, &b_addr0, &full_addr0, &empty_addr0})
    pin_register(*v);

  int slot = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < sched.total_units; u += gridDim.x) {
    const int t = u / sched.splits, part = u - t * sched.splits;
    const int nk = split_begin(part + 1, k_tiles, sched.splits) - split_begin(part, k_tiles, sched.splits);
    const TileCoord c = tile_coord(sm.prefix, p.num_experts, row_tiles, t);
    float acc[kSets][kAcc];
#pragma unroll
    for (int s = 0; s < kSets; ++s)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[s][i] = 0.0f;

    for (int kt = 0; kt < nk; ++kt) {
      mbar_wait(full_addr0 + uint32_t(slot) * 8u, phase);
      const uint32_t chunk_off = uint32_t(slot) * kChunkBytes;
      const uint4 words = lds128(code_addr0 + chunk_off);
      const uint2 sc = lds64(scale_addr0 + chunk_off);
      const uint32_t b_stage = b_addr0 + uint32_t(slot) * uint32_t(kBlockN * kBlockK * 2);
      uint32_t b[kNB][2][4];  // [n8 block][K steps 0-1 / 2-3][b0, b1 of the first, b0, b1 of the second]
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        ldsm_x4(b_stage + uint32_t(nb * 1024), b[nb][0]);
        ldsm_x4((b_stage + uint32_t(nb * 1024)) ^ 64u, b[nb][1]);
      }
      const uint32_t kw[4] = {words.x, words.y, words.z, words.w};  // codes of K steps 0..3
      const uint32_t ks_scale[4] = {scales_to_bf16x2<false>(sc.x, s_mul, s_add), scales_to_bf16x2<true>(sc.x, s_mul, s_add),
                                    scales_to_bf16x2<false>(sc.y, s_mul, s_add), scales_to_bf16x2<true>(sc.y, s_mul, s_add)};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t a[4];
        decode_kstep(kw[ks], ks_scale[ks], a);
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb)
          mma_m16n8k16_bf16(&acc[ks % kSets][4 * nb], a, b[nb][ks / 2][2 * (ks % 2)], b[nb][ks / 2][2 * (ks % 2) + 1]);
      }
      // Every lane's shared reads of this slot are in registers (the MMAs consumed them).
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_addr0 + uint32_t(slot) * 8u);
      if (++slot == p.stages) {
        slot = 0;
        phase ^= 1u;
      }
    }
    if constexpr (kSets == 2) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[0][i] += acc[1][i];
    }
    if (sched.splits > 1 && !split_k_merge(p, acc[0], u, t, sched.splits, int(threadIdx.x), sm.split_flag))
      continue;
    store_tile(p, acc[0], c, kBlockN, warp, lane);
  }
}

}  // namespace fp4moe::cuda::sm90
