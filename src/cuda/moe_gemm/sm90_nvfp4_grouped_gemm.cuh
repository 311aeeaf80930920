// sm_90a grouped GEMM for MoE experts with NVFP4 / MXFP4 weights and BF16 activations
// (W4A16), on wgmma. A and B are swapped: weight rows are the wgmma M side, decoded from FP4
// to BF16 in registers (the register-A form of wgmma), tokens are the N side, brought into
// shared memory by TMA. One kernel template per tokens-per-tile (kBlockN); format and
// epilogue are uniform run-time switches.
//
//   y[m, f] = epilogue( alpha_e * sum_k x[m, k] * W_e[f, k] ),   alpha_e = global_e * 2^7
//
// Decode (per thread, per 16-wide K step; the bit layout is in sm90_fp4_word.hpp): the 8
//   codes of a word become four BF16x2 e2m1 * 2^-126 patterns with shifts, masks and one
//   multiply; the block scale enters as the BF16 S = scale * 2^119, pre-encoded at upload in
//   one byte (S = c * mul + add: PRMT + IMAD for both formats), and one mul.rn.bf16x2 (its
//   scale operand broadcast by HMUL2's half selector) gives e2m1 * scale * 2^-7, exact: at
//   most 6 significant bits, in [2^-17, 21]. The epilogue multiplies by 2^7 * global.
// Shared with the mma.sync decode kernel: sm90_grouped_common.cuh.
#pragma once

#include <cstdint>

#include "cuda/moe_gemm/sm90_grouped_common.cuh"
#include "cuda/moe_gemm/sm90_wgmma_rs.cuh"

namespace fp4moe::cuda::sm90 {

template <int kAcc>
__device__ __forceinline__ void fence_acc(float (&d)[kAcc]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 4 wgmmas (K steps) of one K stage, N = kN tokens (<= the tile's width). desc_lo = the
// low word of the stage's B descriptor (make_desc_k_sw128); the high word is constant, and a
// K step advances the start address by 32 B in 32-bit arithmetic (no carry into bit 16: shared
// addresses are < 2^18).
template <int kN>
__device__ __forceinline__ void mma_stage(float* acc, const uint32_t (&a)[4][4], uint32_t desc_lo) {
  constexpr uint64_t kHi = (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);  // as make_desc_k_sw128
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) WgmmaRs<kN>::mma(acc, a[ks], kHi | uint64_t(desc_lo + uint32_t((ks * 32) >> 4)));
}

template <int kBlockN>
__global__ void __launch_bounds__(sm90_threads(kBlockN), sm90_ctas_per_sm(kBlockN))
    sm90_fp4_grouped_gemm_kernel(const __grid_constant__ CUtensorMap tmap_x, const GroupedGemmParams p) {
  using Mma = WgmmaRs<kBlockN>;
  constexpr int kAcc = Mma::kAcc;
  const Sm90SmemLayout L = sm90_smem_layout(kBlockN, p.stages, p.num_experts);
  extern __shared__ uint8_t smem_raw[];
  const Sm90Smem sm = carve_smem(smem_raw, L);
  const Sm90Schedule sched = schedule_prologue<kBlockN>(p, sm, kConsumerWarpgroups, &tmap_x);

  const int tid = threadIdx.x;
  const int row_tiles = p.n / kBlockM;
  const int k_tiles = p.k / kBlockK;
  const int wg = tid / 128;  // 0, 1: consumers; threads from 256 on: the producer

  if (tid >= 128 * kConsumerWarpgroups) {
    // ---------------- producer ----------------
    if constexpr (sm90_ctas_per_sm(kBlockN) == 1) setmaxnreg_dec<40>();
    if (tid == 128 * kConsumerWarpgroups) produce<kBlockN>(p, &tmap_x, sm, sched);
  } else {
    // ---------------- consumers ----------------
    if constexpr (sm90_ctas_per_sm(kBlockN) == 1) setmaxnreg_inc<232>();
    const int cw = wg;                // consumer warpgroup 0..1: rows 64 * cw .. + 63 of the tile
    const int ctid = tid - 128 * wg;  // 0..127
    const int warp = ctid / 32, lane = ctid % 32, g = lane / 4;
    const bool mx_fmt = p.mxfp4 != 0;
    const uint32_t s_mul = mx_fmt ? kScaleMulMxfp4 : kScaleMulNvfp4;
    const uint32_t s_add = (mx_fmt ? kScaleAddMxfp4 : kScaleAddNvfp4) * 0x00010001u;
    // Loop-invariant shared addresses: this thread's codes / scales within a chunk, the
    // first chunk, the low descriptor word of the first B stage.
    const uint32_t chunk_base = smem_u32(sm.chunk);
    const uint32_t code_off = uint32_t(cw * 128 + ctid) * 16;
    const uint32_t scale_off = uint32_t(kCodeBytes + ((cw * 4 + warp) * 8 + g) * 8);
    const uint32_t desc_lo0 = uint32_t(make_desc_k_sw128(smem_u32(sm.b)));
    float acc[kAcc];
    uint32_t a0[4][4], a1[4][4];  // two register buffers of decoded A: 4 K steps each
    int s_next = 0;               // ring position and phase, advanced without divisions
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < sched.total_units; u += gridDim.x) {
      const int t = u / sched.splits, part = u - t * sched.splits;
      const int nk = split_begin(part + 1, k_tiles, sched.splits) - split_begin(part, k_tiles, sched.splits);
      const TileCoord c = tile_coord(sm.prefix, p.num_experts, row_tiles, t);
      // Last token tile of an expert: run the narrowest wgmma N (quarters of kBlockN) that
      // covers its tokens, so a 20-token tail does not cost a 256-token MMA.
      const int left = p.offsets[c.expert + 1] - p.offsets[c.expert] - c.token_tile * kBlockN;
      const int quarters = kBlockN >= 64 ? min(4, (left + kBlockN / 4 - 1) / (kBlockN / 4)) : 4;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
      fence_acc(acc);
      int prev_stage = -1;
      // One K stage: decode its 4 K steps, issue 4 wgmmas as one group, then wait for the
      // PREVIOUS stage's group (decode of stage kt overlaps the MMAs of stage kt - 1).
      auto stage = [&](uint32_t(&a)[4][4]) {
        const int s = s_next;
        mbar_wait(&sm.full[s], phase);
        const uint32_t chunk = chunk_base + uint32_t(s) * kChunkBytes;
        const uint4 words = lds128(chunk + code_off);
        const uint2 sc = lds64(chunk + scale_off);
        const uint32_t desc0 = desc_lo0 + uint32_t(s) * uint32_t(kBlockN * kBlockK * 2 / 16);
        decode_kstep(words.x, scales_to_bf16x2<false>(sc.x, s_mul, s_add), a[0]);
        decode_kstep(words.y, scales_to_bf16x2<true>(sc.x, s_mul, s_add), a[1]);
        decode_kstep(words.z, scales_to_bf16x2<false>(sc.y, s_mul, s_add), a[2]);
        decode_kstep(words.w, scales_to_bf16x2<true>(sc.y, s_mul, s_add), a[3]);
        wgmma_fence();
        if constexpr (kBlockN >= 64) {
          if (quarters == 4) mma_stage<kBlockN>(acc, a, desc0);
          else if (quarters == 3) mma_stage<kBlockN * 3 / 4>(acc, a, desc0);
          else if (quarters == 2) mma_stage<kBlockN / 2>(acc, a, desc0);
          else mma_stage<kBlockN / 4>(acc, a, desc0);
        } else {
          mma_stage<kBlockN>(acc, a, desc0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (prev_stage >= 0 && ctid == 0) mbar_arrive(&sm.empty[prev_stage]);
        prev_stage = s;
        if (++s_next == p.stages) {
          s_next = 0;
          phase ^= 1u;
        }
      };
      int kt = 0;
      for (; kt + 1 < nk; kt += 2) {
        stage(a0);
        stage(a1);
      }
      if (kt < nk) stage(a0);
      wgmma_wait<0>();
      fence_acc(acc);
      if (prev_stage >= 0 && ctid == 0) mbar_arrive(&sm.empty[prev_stage]);

      if constexpr (sm90_split_k_capable(kBlockN)) {
        if (sched.splits > 1 && !split_k_merge(p, acc, u, t, sched.splits, tid, sm.split_flag)) continue;
      }
      store_tile(p, acc, c, kBlockN, cw * 4 + warp, lane);
    }
  }
}

}  // namespace fp4moe::cuda::sm90
