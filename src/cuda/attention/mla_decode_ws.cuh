// The warp-specialized MLA decode kernel for an FP8 E4M3 cache (sm_90a; MlaDecodeMma with
// DecodeMath::kWgmmaWs; launched by mla_decode_mma.cu, run on the CPU by
// tests/cuda/mla_decode_emu_test.cpp). Same items, schedule (host-built or DeviceSchedule), Params,
// merge and results as mla_decode_kernel; what changes is who does what:
//
// One CTA = one work item x 64 heads, 3 warpgroups (CfgWs):
//   WG 2, the producer (setmaxnreg down to 56 registers): streams the item's tiles of 32 keys,
//     [latent 512 | rope 64] E4M3 codes gathered through the page table / slot list by cp.async
//     into a ring of 3 code tiles (two tiles in flight while it converts one), and converts every
//     tile ONCE to FP16 (exact: E4M3 is a subset of FP16) into a ring of 2 FP16 tiles laid out as
//     wgmma's no-swizzle core matrices (CfgWg's layout). Each thread converts the chunks it copied,
//     so no barrier sits between its copies and its conversion.
//   WG 0 / 1, the consumers (setmaxnreg up to 224): the wgmma variant's math on the FP16 tile —
//     WG dh computes S[64 heads x 32 keys] over its half of the 576 dims (m64n32k16, Q and K from
//     shared memory), the halves swap through shared memory, the online softmax runs in
//     registers, and WG dh accumulates O[64 x 256] for latent dims 256 dh .. (m64n256k16, P from
//     registers, V = the same FP16 tile, MN-major).
// Handshakes, by named barriers (no __syncthreads after the prologue): FP16 tile s is FULL once
// the producer has converted and fenced it (bar.arrive; the consumers bar.sync), EMPTY once both
// consumer warpgroups have finished its P.V (bar.arrive; the producer bar.sync before it writes
// tile s again); the consumers' S swap has its own barrier; the producer's slot ring its own.
// So the next tile's loads and conversion overlap this tile's QK / softmax / PV, and the 8
// consumer warps do no conversion and no copies at all (the mma.sync kernel's 4 head-block
// warps each converted every K / V element they read).
//
// Q: converted to FP16 once in the prologue by all 384 threads (load_q_fp16: q_pe times
// kpe_scale / ckv_scale, a power-of-two factor against FP16 overflow), the score scale takes
// ckv_scale / factor, the output ckv_scale: the FP16 math of the other FP8 paths.
#pragma once

#include "cuda/attention/mla_decode_mma.cuh"

namespace fp4moe::cuda::attention::decode {

namespace {

// kQRegs: each consumer thread holds its warp's Q fragments for the first CfgWs::kQRegSteps (14)
// of the 18 k16 steps over its warpgroup's 288 dims (4 registers a step), whose QK takes A from
// registers (m64n32k16 RS): 57 KB less shared-memory traffic per tile (of ~250 KB). More steps
// spill (CfgWs).
template <bool kQRegs>
__global__ void __launch_bounds__(CfgWs::kThreads, 1) mla_decode_ws_kernel(const Params p) {
  using C = CfgWs;
  FP4MOE_DYNAMIC_SMEM(unsigned char, smem);
  unsigned char* sq = smem;                                       // [64 x 576] FP16, core matrices
  unsigned char* scode = sq + C::kQBytes;                         // [kCodeStages][32][576] codes
  unsigned char* sconv = scode + C::kCodeStages * C::kCodeBytes;  // [kConvStages][32 x 576] FP16, core matrices
  float* sx = reinterpret_cast<float*>(sconv + C::kConvStages * C::kConvBytes);  // [consumer warp][nt][lane][4]
  unsigned* s_amax = reinterpret_cast<unsigned*>(sx + 8 * C::kNT * 32 * 4);
  int64_t* s_slot = reinterpret_cast<int64_t*>(s_amax + 4);  // [kCodeStages][kTk]: tile u's slots at u % kCodeStages

  prims::pdl_wait();
  prims::pdl_release();
  const Item it = p.items ? p.items[blockIdx.x]
                          : device_item(p.sched, int(blockIdx.x) / p.sched.splits, int(blockIdx.x) % p.sched.splits);
  if (it.kv_end <= it.kv_start) return;  // an unused slot of a device-built schedule (whole CTA)
  const int head0 = int(blockIdx.y) * kHeadsPerCta;
  const int tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int n_keys = it.kv_end - it.kv_start;
  const int tiles = (n_keys + C::kTk - 1) / C::kTk;

  const float q_factor = load_q_fp16<C::kThreads, true>(p, it.token, head0, sq, s_amax);
  prims::fence_proxy_async_smem();  // Q, visible to wgmma's operand reads
  __syncthreads();

  if (warp >= C::kConsumerThreads / 32) {
    // ---------------- producer: copies and conversions ----------------
    prims::setmaxnreg_dec<kQRegs ? C::kProducerRegsQ : C::kProducerRegs>();
    const int pt = tid - C::kConsumerThreads;
    const int32_t* table = p.kv_indices + it.table_offset;
    const int page_mask = (1 << p.page_shift) - 1;
    // Key r of tile u: its table entry (0 past the item's end), and the slot it gives. The slots
    // of tile u + kCodeStages are read from the table while tile u is converted, stored in ring
    // entry u % kCodeStages, and read by issue() after the next producer barrier.
    auto table_entry = [&](int u, int r) -> int32_t {
      const int key = it.kv_start + u * C::kTk + r;
      return key < it.kv_end ? table[key >> p.page_shift] : 0;
    };
    auto slot_of = [&](int u, int r, int32_t entry) -> int64_t {
      const int key = it.kv_start + u * C::kTk + r;
      return key < it.kv_end ? (int64_t(entry) << p.page_shift) + (key & page_mask) : 0;
    };
    if (pt < C::kCodeStages * C::kTk) s_slot[pt] = slot_of(pt / C::kTk, pt % C::kTk, table_entry(pt / C::kTk, pt % C::kTk));
    prims::bar_sync(C::kBarProducer, C::kProducerThreads);

    constexpr int kPerThread = C::kTk * C::kChunks / C::kProducerThreads;  // 9 chunks of 16 codes
    // Code tile t -> code stage t % kCodeStages: key rows [latent | rope], zero past the item's end.
    auto issue = [&](int t) {
      if (t < tiles) {
        unsigned char* st = scode + (t % C::kCodeStages) * C::kCodeBytes;
        const int64_t* slots = s_slot + (t % C::kCodeStages) * C::kTk;
#pragma unroll 1
        for (int j = 0; j < kPerThread; ++j) {
          const int ci = pt + j * C::kProducerThreads, r = ci / C::kChunks, part = ci % C::kChunks;
          const bool valid = it.kv_start + t * C::kTk + r < it.kv_end;
          const int64_t slot = slots[r];
          const unsigned char* src = part < C::kLatentChunks ? p.ckv + slot * kCkv + part * 16
                                                             : p.kpe + slot * kKpe + (part - C::kLatentChunks) * 16;
          prims::cp_async16(st + r * C::kRowBytes + part * 16, src, valid);
        }
      }
      prims::cp_async_commit();  // empty groups keep the wait count uniform
    };
#pragma unroll
    for (int s = 0; s < C::kCodeStages - 1; ++s) issue(s);

    for (int t = 0; t < tiles; ++t) {
      // Ring entry (t + kCodeStages - 1) % kCodeStages holds that tile's slots (written at the end
      // of iteration t - 1 by threads 0..31); its old tile's copies were issued before the
      // previous barrier. Code stage (t - 1) % kCodeStages was last read by this thread's own
      // conversion of tile t - 1.
      prims::bar_sync(C::kBarProducer, C::kProducerThreads);
      issue(t + C::kCodeStages - 1);
      const int32_t next_entry = pt < C::kTk ? table_entry(t + C::kCodeStages, pt) : 0;
      prims::cp_async_wait<C::kCodeStages - 1>();  // this thread's copies of tile t have landed
      const int stage = t % C::kConvStages;
      if (t >= C::kConvStages) prims::bar_sync(C::kBarEmpty + stage, C::kThreads);  // tile t - 2's P.V done
      const unsigned char* st = scode + (t % C::kCodeStages) * C::kCodeBytes;
      unsigned char* cv = sconv + stage * C::kConvBytes;
#pragma unroll 1
      for (int j = 0; j < kPerThread; ++j) {
        const int ci = pt + j * C::kProducerThreads, r = ci / C::kChunks, part = ci % C::kChunks;  // dims 16 part ..
        const uint4 v = *reinterpret_cast<const uint4*>(st + r * C::kRowBytes + part * 16);
        *reinterpret_cast<uint4*>(cv + core_chunk_at(r, 2 * part)) =
            uint4{prims::cvt_e4m3x2_f16x2(v.x), prims::cvt_e4m3x2_f16x2(v.x >> 16), prims::cvt_e4m3x2_f16x2(v.y),
                  prims::cvt_e4m3x2_f16x2(v.y >> 16)};
        *reinterpret_cast<uint4*>(cv + core_chunk_at(r, 2 * part + 1)) =
            uint4{prims::cvt_e4m3x2_f16x2(v.z), prims::cvt_e4m3x2_f16x2(v.z >> 16), prims::cvt_e4m3x2_f16x2(v.w),
                  prims::cvt_e4m3x2_f16x2(v.w >> 16)};
      }
      prims::fence_proxy_async_smem();  // this thread's FP16 chunks, visible to wgmma
      prims::bar_arrive(C::kBarFull + stage, C::kThreads);
      if (pt < C::kTk) s_slot[(t % C::kCodeStages) * C::kTk + pt] = slot_of(t + C::kCodeStages, pt, next_entry);
    }
    prims::cp_async_wait<0>();
    return;
  }

  // ---------------- consumers: QK, softmax, PV ----------------
  prims::setmaxnreg_inc<kQRegs ? C::kConsumerRegsQ : C::kConsumerRegs>();
  const int g = lane >> 2, c = lane & 3, hb = warp & 3, dh = warp >> 2;
  constexpr int kSteps = kQk / 2 / 16;  // 18 k16 steps over the warpgroup's half of the dims
  constexpr int kRegSteps = kQRegs ? C::kQRegSteps : 0;  // of which A from registers
  const float qk_scale = p.sm_scale * kLog2e * p.ckv_scale / q_factor;  // base-2 scores of the FP16 Q
  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  constexpr uint32_t kLbo = 128, kSbo = C::kDimGroups * 128;
  const int d_begin = dh * (kQk / 2);  // 0 or 288
  // kQRegs: the A fragments of Q rows 16 hb + g (+ 8), dims d_begin + 16 ks + 2c (+ 8), +1: two
  // FP16 each, read once from the core-matrix Q (4 contiguous bytes within a core-matrix row).
  uint32_t qa[kQRegs ? kRegSteps : 1][4];
  if constexpr (kQRegs) {
    const int r0 = hb * 16 + g;
#pragma unroll
    for (int ks = 0; ks < kRegSteps; ++ks) {
      const int dgr = d_begin / 8 + 2 * ks;
      qa[ks][0] = *reinterpret_cast<const uint32_t*>(sq + core_chunk_at(r0, dgr) + 4 * c);
      qa[ks][1] = *reinterpret_cast<const uint32_t*>(sq + core_chunk_at(r0 + 8, dgr) + 4 * c);
      qa[ks][2] = *reinterpret_cast<const uint32_t*>(sq + core_chunk_at(r0, dgr + 1) + 4 * c);
      qa[ks][3] = *reinterpret_cast<const uint32_t*>(sq + core_chunk_at(r0 + 8, dgr + 1) + 4 * c);
    }
  }

  for (int t = 0; t < tiles; ++t) {
    const int stage = t % C::kConvStages;
    // Tile t converted (and, as all 256 consumers passed it too, the other warpgroup has read
    // tile t - 1's swapped S: sx may be written again).
    prims::bar_sync(C::kBarFull + stage, C::kThreads);
    const unsigned char* kv = sconv + stage * C::kConvBytes;

    // S[64 heads x 32 keys] over dims d_begin .. +287: 18 k16 steps (CfgWg's descriptors).
    float s[C::kNT][4];
#pragma unroll
    for (int i = 0; i < C::kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    prims::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const int dgr = d_begin / 8 + 2 * ks;
      if (ks < kRegSteps)
        prims::wgmma_m64n32k16_rs<true>(reinterpret_cast<float(&)[16]>(s), qa[ks < kRegSteps ? ks : 0],
                                        prims::smem_desc(kv + dgr * 128, kLbo, kSbo), ks > 0);
      else
        prims::wgmma_m64n32k16_ss<true>(reinterpret_cast<float(&)[16]>(s), prims::smem_desc(sq + dgr * 128, kLbo, kSbo),
                                        prims::smem_desc(kv + dgr * 128, kLbo, kSbo), ks > 0);
    }
    prims::wgmma_commit();
    prims::wgmma_wait<0>();

    // The two halves' partial S: swap, add (dh 0's half first in both: identical sums).
#pragma unroll
    for (int i = 0; i < C::kNT; ++i)
      *reinterpret_cast<float4*>(sx + ((warp * C::kNT + i) * 32 + lane) * 4) = float4{s[i][0], s[i][1], s[i][2], s[i][3]};
    prims::bar_sync(C::kBarSwap, C::kConsumerThreads);
#pragma unroll
    for (int i = 0; i < C::kNT; ++i) {
      const float4 x = *reinterpret_cast<const float4*>(sx + (((warp ^ 4) * C::kNT + i) * 32 + lane) * 4);
      if (dh == 0) s[i][0] += x.x, s[i][1] += x.y, s[i][2] += x.z, s[i][3] += x.w;
      else s[i][0] = x.x + s[i][0], s[i][1] = x.y + s[i][1], s[i][2] = x.z + s[i][2], s[i][3] = x.w + s[i][3];
    }

    online_softmax<C::kNT>(s, o, m_run, l_run, qk_scale, t * C::kTk, n_keys, c);

    // O[64 x 256] += P[64 x 32] . V[32 x 256] (V: latent dims 256 dh .. of the same FP16 tile).
    prims::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kTk / 16; ++kk) {
      const uint32_t a[4] = {prims::pack_f16x2(s[2 * kk][0], s[2 * kk][1]), prims::pack_f16x2(s[2 * kk][2], s[2 * kk][3]),
                             prims::pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             prims::pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const unsigned char* v = kv + ((2 * kk) * C::kDimGroups + dh * 32) * 128;
      prims::wgmma_m64n256k16_rs_bmn<true>(reinterpret_cast<float(&)[128]>(o), a,
                                           prims::smem_desc(v, C::kDimGroups * 128, 128), true);
    }
    prims::wgmma_commit();
    prims::wgmma_wait<0>();
    // FP16 tile `stage` free for tile t + 2 (the producer waits for it only if that tile exists).
    if (t + C::kConvStages < tiles) prims::bar_arrive(C::kBarEmpty + stage, C::kThreads);
  }

  write_rows<true, true>(p, it, head0 + hb * 16 + g, dh, c, o, m_run, l_run);
}

}  // namespace

}  // namespace fp4moe::cuda::attention::decode
