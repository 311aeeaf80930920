// sm_90a grouped GEMM for MoE experts with NVFP4 / MXFP4 weights and BF16 activations
// (W4A16), on wgmma. A and B are swapped: weight rows are the wgmma M side, decoded from FP4
// to BF16 in registers (the register-A form of wgmma), tokens are the N side, brought into
// shared memory by TMA. One kernel template per tokens-per-tile (kBlockN); format and
// epilogue are uniform run-time switches.
//
//   y[m, f] = epilogue( alpha_e * sum_k x[m, k] * W_e[f, k] ),   alpha_e = global_e * 2^7
//
// Decode (per thread, per 16-wide K step; the bit layout is in sm90_tile_layout.hpp):
//   E2M1 magnitude bits e1 e0 m are moved to BF16 bits 8..6 and the sign to bit 15 with one
//   AND, one multiply (two shifted copies at once) and one AND. That BF16 is exactly
//   e2m1 * 2^-126 (code 1 = 0.5 becomes a BF16 subnormal, which mul.bf16x2 keeps).
//   The block scale enters as the BF16 S = scale * 2^119, pre-encoded at upload in one byte
//   (S = c * mul + add: PRMT + IMAD for both formats), and one mul.rn.bf16x2 (its scale
//   operand broadcast by HMUL2's half selector) gives e2m1 * scale * 2^-7, exact: at most
//   6 significant bits, in [2^-17, 21]. The epilogue multiplies by 2^7 * global.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "cuda/moe_gemm/sm90_ptx.cuh"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"
#include "cuda/moe_gemm/sm90_wgmma_rs.cuh"

namespace fp4moe::cuda::sm90 {

enum class EpilogueKind : int { None = 0, SiluMul = 1, RowScale = 2 };

struct GroupedGemmParams {
  const uint8_t* tiles = nullptr;        // [E, N/128, K/64, 4608 B]
  const float* global_scale = nullptr;   // [E]
  const float* act_global = nullptr;     // device scalar or null (W4A4 emulation)
  const int32_t* offsets = nullptr;      // [E+1]
  const float* row_scale = nullptr;      // [M_total] (RowScale)
  __nv_bfloat16* y = nullptr;            // [M_total, y_ld]
  float* partials = nullptr;             // split-K: [cap units][kAcc / 4][256] float4, or null
  int* counters = nullptr;               // split-K: [cap units] per-tile arrivals (zero on entry)
  int split_cap_units = 0, max_splits = 1;
  int num_experts = 0, n = 0, k = 0, y_ld = 0, stages = 0;
  int epilogue = 0;                      // EpilogueKind
  int mxfp4 = 0;
};

// Decodes one K step: `w` = 8 codes (nibble j -> low half of register j, nibble j + 4 ->
// high half), s2 = {S(r0), S(r1)}: rows r0 (registers 0, 2) multiply by the low half, r1
// (registers 1, 3) by the high half, through HMUL2's operand selector (no PRMT).
__device__ __forceinline__ void decode_kstep(uint32_t w, uint32_t s2, uint32_t (&a)[4]) {
  constexpr uint32_t kMask = 0x81C081C0u;  // sign 15 / 31, magnitude 8..6 / 24..22
  const uint32_t w2 = w >> 8;
  a[0] = mul_bf16x2_lo(((w & 0x000F000Fu) * 0x1040u) & kMask, s2);
  a[1] = mul_bf16x2_hi(((w & 0x00F000F0u) * 0x0104u) & kMask, s2);
  a[2] = mul_bf16x2_lo(((w2 & 0x000F000Fu) * 0x1040u) & kMask, s2);
  a[3] = mul_bf16x2_hi(((w2 & 0x00F000F0u) * 0x0104u) & kMask, s2);
}

// The scale byte pair {c(r0), c(r1)} in the low (kHigh = false) or high 16 bits of `word`
// -> BF16x2 {S(r0), S(r1)} = c * mul + add per half (the chunk's scale encoding,
// sm90_tile_layout.hpp; mul / add are per format): PRMT + IMAD, the same for both formats.
template <bool kHigh>
__device__ __forceinline__ uint32_t scales_to_bf16x2(uint32_t word, uint32_t mul, uint32_t add2) {
  return __byte_perm(word, 0, kHigh ? 0x4342 : 0x4140) * mul + add2;
}

// Which tile of the flattened (expert, token tile, row tile) list; prefix[e] = tiles before e.
struct TileCoord {
  int expert, token_tile, row_tile;
};
__device__ __forceinline__ TileCoord tile_coord(const int* prefix, int num_experts, int row_tiles, int t) {
  int lo = 0, hi = num_experts - 1;  // largest e with prefix[e] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int local = t - prefix[lo];
  return {lo, local / row_tiles, local % row_tiles};
}

// The split factor for `tiles` row tiles on `slots` CTAs: minimises the makespan estimate
// waves(S) * (k_tiles / S + 2) (2 = fill + partial round trip, in K stages); S = 1 unless a
// split is >= 3 % better. Plain integer/float math: the host tests can call it too.
__host__ __device__ inline int sm90_pick_splits(int tiles, int slots, int k_tiles, int max_splits, int cap_units) {
  int best_s = 1;
  const auto cost = [&](int s) {
    const long long units = (long long)tiles * s;
    const long long waves = (units + slots - 1) / slots;
    return float(waves) * (float(k_tiles) / float(s) + 2.0f);
  };
  float best = cost(1);
  for (int s = 2; s <= max_splits && s <= k_tiles; ++s) {
    if ((long long)tiles * s > cap_units) break;
    const float c = cost(s);
    if (c < best * 0.97f) {
      best = c;
      best_s = s;
    }
  }
  return best_s;
}

__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

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
  // Realign to 1024 B by offsetting the __shared__ array itself (keeps shared-space loads).
  uint8_t* smem = smem_raw + ((kSwizzleAlign - (smem_u32(smem_raw) & (kSwizzleAlign - 1))) & (kSwizzleAlign - 1));
  uint8_t* smem_b = smem + L.b_offset;          // [stages][kBlockN][64] bf16, swizzled
  uint8_t* smem_chunk = smem + L.chunk_offset;  // [stages][4608]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.barrier_offset);  // [stages]
  uint64_t* empty = full + p.stages;                                       // [stages]
  int* prefix = reinterpret_cast<int*>(smem + L.sched_offset);             // [E+1], splits, flag
  volatile int* split_flag = prefix + p.num_experts + 2;

  const int tid = threadIdx.x;
  const int row_tiles = p.n / kBlockM;
  const int k_tiles = p.k / kBlockK;

  // Per-expert tile counts -> prefix (warp 0), barriers (thread 0).
  if (tid < 32) {
    int running = 0;
    for (int base = 0; base < p.num_experts; base += 32) {
      const int e = base + tid;
      int v = 0;
      if (e < p.num_experts) {
        const int cnt = max(0, p.offsets[e + 1] - p.offsets[e]);
        v = (cnt + kBlockN - 1) / kBlockN * row_tiles;
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (tid >= o) v += u;
      }
      if (e < p.num_experts) prefix[e + 1] = running + v;
      running += __shfl_sync(0xffffffffu, v, 31);
    }
    if (tid == 0) {
      prefix[0] = 0;
      prefix[p.num_experts + 1] =
          p.partials && p.counters && p.max_splits > 1
              ? sm90_pick_splits(running, int(gridDim.x), k_tiles, p.max_splits, p.split_cap_units)
              : 1;
      for (int s = 0; s < p.stages; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], kConsumerWarpgroups);
      }
      fence_barrier_init();
      prefetch_tensor_map(&tmap_x);
    }
  }
  __syncthreads();
  const int total_tiles = prefix[p.num_experts];
  const int splits = prefix[p.num_experts + 1];
  const int total_units = total_tiles * splits;  // unit u = tile u / splits, K part u % splits
  const int wg = tid / 128;  // 0, 1: consumers; threads from 256 on: the producer

  if (tid >= 128 * kConsumerWarpgroups) {
    // ---------------- producer ----------------
    if constexpr (sm90_ctas_per_sm(kBlockN) == 1) setmaxnreg_dec<40>();
    if (tid == 128 * kConsumerWarpgroups) {
      const uint64_t policy = policy_evict_first();
      const uint32_t stage_tx = kChunkBytes + kBlockN * kBlockK * 2;
      int s = 0;
      uint32_t phase = 0;
      for (int u = blockIdx.x; u < total_units; u += gridDim.x) {
        const int t = u / splits, part = u - t * splits;
        const TileCoord c = tile_coord(prefix, p.num_experts, row_tiles, t);
        const int row0 = p.offsets[c.expert] + c.token_tile * kBlockN;
        const uint8_t* src = p.tiles + (size_t(c.expert) * row_tiles + c.row_tile) * size_t(k_tiles) * kChunkBytes;
        const int kt_end = (part + 1) * k_tiles / splits;
        for (int kt = part * k_tiles / splits; kt < kt_end; ++kt) {
          mbar_wait(&empty[s], phase ^ 1u);
          mbar_arrive_expect_tx(&full[s], stage_tx);
          bulk_copy_g2s(smem_chunk + size_t(s) * kChunkBytes, src + size_t(kt) * kChunkBytes, kChunkBytes, &full[s],
                        policy);
          tma_load_2d(smem_b + size_t(s) * kBlockN * kBlockK * 2, &tmap_x, kt * kBlockK, row0, &full[s]);
          if (++s == p.stages) {
            s = 0;
            phase ^= 1u;
          }
        }
      }
    }
  } else {
    // ---------------- consumers ----------------
    if constexpr (sm90_ctas_per_sm(kBlockN) == 1) setmaxnreg_inc<232>();
    const int cw = wg;                // consumer warpgroup 0..1: rows 64 * cw .. + 63 of the tile
    const int ctid = tid - 128 * wg;  // 0..127
    const int warp = ctid / 32, lane = ctid % 32, g = lane / 4, t4 = lane % 4;
    const bool mx_fmt = p.mxfp4 != 0;
    const uint32_t s_mul = mx_fmt ? kScaleMulMxfp4 : kScaleMulNvfp4;
    const uint32_t s_add = (mx_fmt ? kScaleAddMxfp4 : kScaleAddNvfp4) * 0x00010001u;
    const float act_g = p.act_global ? *p.act_global : 1.0f;
    // Loop-invariant shared addresses: this thread's codes / scales within a chunk, the
    // first chunk, the low descriptor word of the first B stage.
    const uint32_t chunk_base = smem_u32(smem_chunk);
    const uint32_t code_off = uint32_t(cw * 128 + ctid) * 16;
    const uint32_t scale_off = uint32_t(kCodeBytes + ((cw * 4 + warp) * 8 + g) * 8);
    const uint32_t desc_lo0 = uint32_t(make_desc_k_sw128(smem_u32(smem_b)));
    float acc[kAcc];
    uint32_t a0[4][4], a1[4][4];  // two register buffers of decoded A: 4 K steps each
    int s_next = 0;               // ring position and phase, advanced without divisions
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < total_units; u += gridDim.x) {
      const int t = u / splits, part = u - t * splits;
      const int nk = (part + 1) * k_tiles / splits - part * k_tiles / splits;
      const TileCoord c = tile_coord(prefix, p.num_experts, row_tiles, t);
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
        mbar_wait(&full[s], phase);
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
        if (prev_stage >= 0 && ctid == 0) mbar_arrive(&empty[prev_stage]);
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
      if (prev_stage >= 0 && ctid == 0) mbar_arrive(&empty[prev_stage]);

      // ---------------- split-K: partials, the tile's last unit sums them ----------------
      if constexpr (sm90_split_k_capable(kBlockN)) {
      if (splits > 1) {
        float4* part_buf = reinterpret_cast<float4*>(p.partials);
        constexpr int kVec = kAcc / 4;
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          __stcg(part_buf + (size_t(u) * kVec + i) * 256 + tid,
                 make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
        __threadfence();
        consumer_bar();
        if (tid == 0) *split_flag = atomicAdd(p.counters + t, 1) == splits - 1 ? 1 : 0;
        consumer_bar();
        if (*split_flag == 0) continue;  // another unit of this tile finishes it
        __threadfence();
        float sum[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) sum[i] = 0.0f;
        for (int sp = 0; sp < splits; ++sp) {  // fixed order: the result does not depend on who is last
          if (sp == part) {
#pragma unroll
            for (int i = 0; i < kAcc; ++i) sum[i] += acc[i];
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
              const float4 v = __ldcg(part_buf + (size_t(t * splits + sp) * kVec + i) * 256 + tid);
              sum[4 * i] += v.x;
              sum[4 * i + 1] += v.y;
              sum[4 * i + 2] += v.z;
              sum[4 * i + 3] += v.w;
            }
          }
        }
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = sum[i];
        if (tid == 0) p.counters[t] = 0;  // ready for the next launch (the launcher also zeroes)
      }
      }

      // ---------------- epilogue: registers -> global (bf16) ----------------
      const int e = c.expert;
      const int m_begin = p.offsets[e];
      const int m_count = p.offsets[e + 1] - m_begin;
      const float alpha = (mx_fmt ? 1.0f : p.global_scale[e]) * act_g * float(1 << kEpilogueScaleLog2);
      const int tok0 = c.token_tile * kBlockN;
#pragma unroll
      for (int i = 0; i < kAcc / 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int tok = tok0 + 8 * i + 2 * t4 + h;
          if (tok >= m_count) continue;
          const size_t m = size_t(m_begin + tok);
          float v0 = acc[4 * i + h] * alpha;      // fragment row r0
          float v1 = acc[4 * i + 2 + h] * alpha;  // fragment row r1
          if (p.epilogue == int(EpilogueKind::SiluMul)) {
            const int f = 64 * c.row_tile + 32 * cw + 8 * warp + g;
            const float silu = v0 / (1.0f + __expf(-v0));
            p.y[m * p.y_ld + f] = __float2bfloat16_rn(silu * v1);
          } else {
            if (p.epilogue == int(EpilogueKind::RowScale)) {
              const float rs = p.row_scale[m];
              v0 *= rs;
              v1 *= rs;
            }
            const int f = kBlockM * c.row_tile + 64 * cw + 16 * warp + 2 * g;
            *reinterpret_cast<__nv_bfloat162*>(p.y + m * p.y_ld + f) = __floats2bfloat162_rn(v0, v1);
          }
        }
      }
    }
  }
}

}  // namespace fp4moe::cuda::sm90
