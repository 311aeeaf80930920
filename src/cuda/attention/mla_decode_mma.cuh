// Our MLA decode kernel (absorbed form, one query token per row: dense decode and DSA sparse
// rows), warp-level mma.sync m16n8k16 with FP32 accumulation; launched by mla_decode.cpp's
// MlaDecodeMma, run on the CPU by tests/cuda/mla_decode_emu_test.cpp.
//
// One CTA = one work item (a query token and a range of its keys) x 64 heads, 8 warps:
//   warp w: heads 16 (w % 4) .. +16 (hb), half dh = w / 4.
//   QK:  the warp computes S[16 heads x Tk keys] over its half of the 576 dims (dh 0: latent
//        dims 0-287, dh 1: latent 288-511 + rope 0-63), the two halves swap partial S through
//        shared memory and both add: each warp of a pair holds the full S (same sum order).
//   softmax: online, in registers (both warps of a pair compute the same numbers).
//   PV:  the warp accumulates O[16 heads x 256 dims] (dh selects latent dims 256 dh ..), with
//        P from the S registers as the A operand (no shared-memory round trip).
// KV tiles of Tk keys (gathered through the page table / the slot list, 16 B cp.async chunks,
// zero-filled past the end) stream through a 3-stage ring; Q (64 x 576) stays in shared memory.
//
// BF16 cache: Q, K, V BF16 (ldmatrix, .trans for V), P BF16, Tk = 32.
// FP8 E4M3 cache: K / V are converted to FP16 in registers (exact: E4M3 is a subset of FP16)
// right after ldmatrix, so the tile stays FP8 in shared memory and no BF16 copy is made; Q is
// converted once to FP16 (times a power of two when |q| would overflow FP16, undone in the
// softmax scale; q_pe times kpe_scale / ckv_scale); P FP16; FP16 mma; ckv_scale applied to
// the scores and once to O. Tk = 64. The 8-bit fragments need a fixed permutation of the dims
// (QK) and of the output columns (PV), described where they are loaded.
//
// A token whose keys were split over several items writes FP32 partial O and a base-2 LSE per
// item; mla_merge_kernel combines them. Shared memory: ~199 KB (BF16) / ~217 KB (FP8), one CTA
// per SM: sm_90 / sm_100 class GPUs (not sm_120's 99 KB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/mla_decode_params.hpp"
#include "cuda/common/wgmma_prims.cuh"

namespace fp4moe::cuda::attention::decode {

// Kernels and helpers: internal linkage (the emulator tests compile this header too, and a
// kernel's host stub must not meet its CPU twin at link time).
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <bool kFp8>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kFp8) prims::mma_f16_16816(d, a, b0, b1);
  else prims::mma_bf16_16816(d, a, b0, b1);
}

template <bool kFp8>
__device__ __forceinline__ uint32_t pack_p(float lo, float hi) {
  if constexpr (kFp8) return prims::pack_f16x2(lo, hi);
  else return prims::pack_bf16x2(lo, hi);
}

// DeviceSchedule (mla_decode_params.hpp): item i of row t and row t's merge, by the rule of
// build_schedule with the row's part count capped at s.splits, computed where they are used (the
// decode kernel's CTA t * splits + i, the merge kernel's CTA t) from the row's length in device
// memory: no schedule launch, no schedule arrays.
struct RowSpan {
  int L, table, n, per;  // keys, table offset, parts, keys per part
};
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ RowSpan row_span(const DeviceSchedule& s, int t) {
  RowSpan r{};
  if (s.top_k > 0) {
    r.L = imin(s.top_k, s.positions[t] + 1);
    r.table = t * s.top_k;
  } else {
    r.L = s.kv_len[t];
    r.table = s.page_indptr[t];
  }
  r.L = imax(r.L, 0);
  const PartSplit p = split_parts((r.L + s.tile_keys - 1) / s.tile_keys, s.splits);
  r.n = p.n;
  r.per = p.per_tiles * s.tile_keys;
  return r;
}
__device__ __forceinline__ Item device_item(const DeviceSchedule& s, int t, int i) {
  const RowSpan r = row_span(s, t);
  Item it{};
  it.token = t;
  it.table_offset = r.table;
  it.partial = -1;
  if (i < r.n) {
    it.kv_start = imin(r.L, i * r.per);
    it.kv_end = imin(r.L, (i + 1) * r.per);
    if (r.n > 1) it.partial = t * s.splits + i;
  }
  return it;
}
__device__ __forceinline__ Merge device_merge(const DeviceSchedule& s, int t) {
  const RowSpan r = row_span(s, t);
  return Merge{t, t * s.splits, r.n > 1 ? r.n : 0, 0};
}

// wgmma: 16-bit chunk g (dims 8 g ..) of row r in core matrices. The FP8 cache's codes land as plain
// rows (part: codes 16 part ..) and are converted into that layout.
__device__ __forceinline__ int core_chunk_at(int r, int g) { return ((r >> 3) * CfgWg::kDimGroups + g) * 128 + (r & 7) * 16; }
// Byte offsets of 16-byte chunk `part` (dims 8 part ..) of Q row h / of key row r of a tile: padded
// rows (mma.sync: ldmatrix) or 8 x 8 core matrices (wgmma: CfgWg).
template <bool kFp8, bool kWg>
__device__ __forceinline__ int q_chunk_at(int h, int part) {
  if constexpr (kWg) return core_chunk_at(h, part);
  else return h * Cfg<kFp8>::kQPitch + part * 16;
}
template <bool kFp8, bool kWg>
__device__ __forceinline__ int kv_chunk_at(int r, int part) {
  if constexpr (kWg && !kFp8) return core_chunk_at(r, part);
  else if constexpr (kWg) return r * CfgWgFp8::kRowBytes + part * 16;
  else return r * Cfg<kFp8>::kKvPitch + part * 16;
}

// FP8 cache: the CTA's Q rows [q_nope 512 | q_pe 64] of heads head0 .. head0 + 63 to FP16 in
// shared memory (padded rows, or kWg: core matrices), q_pe times kpe_scale / ckv_scale, all times
// a power of two when |q| would overflow FP16 (returned: the softmax scale divides it out).
// Every one of the block's kN threads calls it (two block barriers).
template <int kN, bool kWg>
__device__ __forceinline__ float load_q_fp16(const Params& p, int token, int head0, unsigned char* sq, unsigned* s_amax) {
  const int tid = int(threadIdx.x);
  // Each thread converts 8 BF16 values at a time; first the CTA's amax (as uint bits).
  constexpr int kParts = kQk / 8;                    // 72 groups of 8 per row
  constexpr int kPer = kHeadsPerCta * kParts / kN;   // 18 (256 threads), 12 (384)
  static_assert(kHeadsPerCta * kParts % kN == 0, "");
  uint4 v[kPer];
  float amax = 0.f, q_factor = 1.f;
  const float pe_ratio = p.kpe_scale / p.ckv_scale;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int ci = tid + j * kN, h = ci / kParts, part = ci % kParts;
    const int64_t row = int64_t(token) * p.num_heads + head0 + h;
    const uint16_t* src = part < kCkv / 8 ? p.q_nope + row * kCkv + part * 8 : p.q_pe + row * kKpe + (part - kCkv / 8) * 8;
    v[j] = *reinterpret_cast<const uint4*>(src);
    const float f = part < kCkv / 8 ? 1.f : pe_ratio;
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      amax = fmaxf(amax, fabsf(prims::bf16_bits_to_float(w[e] & 0xffffu) * f));
      amax = fmaxf(amax, fabsf(prims::bf16_bits_to_float(w[e] >> 16) * f));
    }
  }
  if (tid == 0) *s_amax = 0u;
  __syncthreads();
  atomicMax(s_amax, __float_as_uint(amax));  // non-negative floats order as their bits
  __syncthreads();
  const float cta_amax = __uint_as_float(*s_amax);
  // Keep |q| * factor below 2^14 (FP16 max 65504): factor = 2^(13 - floor(log2 amax)).
  if (cta_amax >= 16384.f) q_factor = __uint_as_float(uint32_t(127 + 13 - (int((__float_as_uint(cta_amax) >> 23) & 0xff) - 127)) << 23);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int ci = tid + j * kN, h = ci / kParts, part = ci % kParts;
    const float f = (part < kCkv / 8 ? 1.f : pe_ratio) * q_factor;
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      o[e] = prims::pack_f16x2(prims::bf16_bits_to_float(w[e] & 0xffffu) * f, prims::bf16_bits_to_float(w[e] >> 16) * f);
    *reinterpret_cast<uint4*>(sq + q_chunk_at<true, kWg>(h, part)) = uint4{o[0], o[1], o[2], o[3]};
  }
  return q_factor;
}

// The online softmax over one tile's scores s (this thread's quad columns of rows g (e 0, 1) and
// g + 8 (e 2, 3); already the full sums): scaled to base 2, keys >= n_keys masked, s becomes P,
// the running max / sum updated and O rescaled.
template <int kNT>
__device__ __forceinline__ void online_softmax(float (&s)[kNT][4], float (&o)[32][4], float (&m_run)[2],
                                               float (&l_run)[2], float qk_scale, int key0, int n_keys, int c) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + i * 8 + 2 * c + e;
        float v = s[i][2 * rr + e] * qk_scale;
        if (key >= n_keys) v = -INFINITY;
        s[i][2 * rr + e] = v;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(prims::kFullMask, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(prims::kFullMask, mx, 2));
    const float m_new = fmaxf(m_run[rr], mx);  // finite: every tile has a valid key
    const float alpha = prims::fast_exp2(m_run[rr] - m_new);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = prims::fast_exp2(s[i][2 * rr + e] - m_new);
        s[i][2 * rr + e] = pv;
        sum += pv;
      }
    l_run[rr] = l_run[rr] * alpha + sum;  // this thread's columns; the quad adds at the end
    m_run[rr] = m_new;
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i][2 * rr] *= alpha, o[i][2 * rr + 1] *= alpha;
  }
}

// The end of an item: l over the quad, O normalized, written (BF16 output and LSE, or the FP32
// partial row and base-2 LSE of a split token) for heads h_lo and h_lo + 8, latent dims 256 dh ..
// kNaturalO: O's fragments in column order (else the FP8 mma.sync path's permutation).
template <bool kNaturalO, bool kFp8>
__device__ __forceinline__ void write_rows(const Params& p, const Item& it, int h_lo, int dh, int c, const float (&o)[32][4],
                                           const float (&m_run)[2], const float (&l_run)[2]) {
  float inv[2], lse2[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_run[rr];
    l += __shfl_xor_sync(prims::kFullMask, l, 1);
    l += __shfl_xor_sync(prims::kFullMask, l, 2);
    inv[rr] = (kFp8 ? p.ckv_scale : 1.f) / l;
    lse2[rr] = m_run[rr] + log2f(l);
  }
  if (it.partial < 0) {
    uint16_t* out = p.out + (int64_t(it.token) * p.num_heads + h_lo) * kCkv + dh * 256;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      uint16_t* orow = out + rr * 8 * kCkv;
      if constexpr (kNaturalO) {
#pragma unroll
        for (int i = 0; i < 32; ++i)  // tile i: dims 8i + 2c, +1
          *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * c) = prims::pack_bf16x2(o[i][2 * rr] * inv[rr], o[i][2 * rr + 1] * inv[rr]);
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) {  // even / odd tiles of a 16-dim block: dims 4c .. 4c+3
          const int d = (q >> 1) * 32 + (q & 1) * 16 + 4 * c;  // o[2q] even, o[2q + 1] odd tile
          *reinterpret_cast<uint2*>(orow + d) =
              uint2{prims::pack_bf16x2(o[2 * q][2 * rr] * inv[rr], o[2 * q + 1][2 * rr] * inv[rr]),
                    prims::pack_bf16x2(o[2 * q][2 * rr + 1] * inv[rr], o[2 * q + 1][2 * rr + 1] * inv[rr])};
        }
      }
      if (p.lse && dh == 0 && c == 0) p.lse[int64_t(it.token) * p.num_heads + h_lo + rr * 8] = lse2[rr] * kLn2;
    }
  } else {
    float* out = p.part_o + (int64_t(it.partial) * p.num_heads + h_lo) * kCkv + dh * 256;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float* orow = out + rr * 8 * kCkv;
      if constexpr (kNaturalO) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
          *reinterpret_cast<float2*>(orow + i * 8 + 2 * c) = float2{o[i][2 * rr] * inv[rr], o[i][2 * rr + 1] * inv[rr]};
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const int d = (q >> 1) * 32 + (q & 1) * 16 + 4 * c;
          *reinterpret_cast<float4*>(orow + d) = float4{o[2 * q][2 * rr] * inv[rr], o[2 * q + 1][2 * rr] * inv[rr],
                                                        o[2 * q][2 * rr + 1] * inv[rr], o[2 * q + 1][2 * rr + 1] * inv[rr]};
        }
      }
      if (dh == 0 && c == 0) p.part_lse[int64_t(it.partial) * p.num_heads + h_lo + rr * 8] = lse2[rr];
    }
  }
}

// kWg: the wgmma variant (sm_90a; CfgWg's layout; FP8: CfgWgFp8's FP16 tiles): the warpgroup of
// warps 4 dh .. 4 dh + 3 computes S over its half of the dims as one m64n32 accumulator (18 k16
// steps, Q and K from shared memory), and O for its 256 latent dims as one m64n256 accumulator
// (P from registers, V from shared memory); the fragments are those of the mma.sync path (the
// BF16 one: no FP8 permutations), so the swap, the softmax, the merge and the writes are shared.
template <bool kFp8, bool kWg = false>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(const Params p) {
  using C = std::conditional_t<kWg, std::conditional_t<kFp8, CfgWgFp8, CfgWg>, Cfg<kFp8>>;
  constexpr bool kNaturalO = !kFp8 || kWg;  // O's fragments in column order (else the FP8 mma path's permutation)
  FP4MOE_DYNAMIC_SMEM(unsigned char, smem);
  unsigned char* sq = smem;                                     // [64][kQPitch]
  unsigned char* skv = smem + C::kQBytes;                       // [kStages][kTk][kKvPitch]
  unsigned char* sconv = skv + kStages * C::kStageBytes;          // wgmma + FP8: [2][kConvBytes]
  float* sx = reinterpret_cast<float*>(sconv + 2 * C::kConvBytes);  // [warp][nt][lane][4]
  unsigned* s_amax = reinterpret_cast<unsigned*>(sx + kWarps * C::kNT * 32 * 4);
  int64_t* s_slot = reinterpret_cast<int64_t*>(s_amax + 4);  // [kStages][kTk]: tile u's slots at u % kStages

  prims::pdl_wait();  // launched with PDL: the items / slots / queries may come from the kernel before
  prims::pdl_release();
  // The item: the host plan's, or (run_device) computed from the row's length in device memory.
  const Item it = p.items ? p.items[blockIdx.x]
                          : device_item(p.sched, int(blockIdx.x) / p.sched.splits, int(blockIdx.x) % p.sched.splits);
  if (it.kv_end <= it.kv_start) return;  // an unused slot of a device-built schedule (whole CTA)
  const int head0 = int(blockIdx.y) * kHeadsPerCta;
  const int tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int g = lane >> 2, c = lane & 3, hb = warp & 3, dh = warp >> 2;
  const int n_keys = it.kv_end - it.kv_start;
  const int tiles = (n_keys + C::kTk - 1) / C::kTk;
  const int32_t* table = p.kv_indices + it.table_offset;
  const int page_mask = (1 << p.page_shift) - 1;

  // The cache slots of a tile's keys go through shared memory, read from the page table /
  // slot list one iteration before the tile is issued: a thread's copies then wait on no
  // global load (the table entry of each of its ~9 copies used to be loaded just before it).
  // Key r of tile u: its table entry (0 past the item's end), and the slot it gives.
  auto table_entry = [&](int u, int r) -> int32_t {
    const int key = it.kv_start + u * C::kTk + r;
    return key < it.kv_end ? table[key >> p.page_shift] : 0;
  };
  auto slot_of = [&](int u, int r, int32_t entry) -> int64_t {
    const int key = it.kv_start + u * C::kTk + r;
    return key < it.kv_end ? (int64_t(entry) << p.page_shift) + (key & page_mask) : 0;
  };
  // BF16: the Q copies go out first (they need only the item), so their latency overlaps the
  // table loads below; tile 0's commit takes them into its group.
  if constexpr (!kFp8) {
    for (int ci = tid; ci < kHeadsPerCta * (kQk * 2 / 16); ci += kThreads) {
      const int h = ci / (kQk * 2 / 16), part = ci % (kQk * 2 / 16);
      const int64_t row = int64_t(it.token) * p.num_heads + head0 + h;
      const void* src = part < kCkv * 2 / 16 ? static_cast<const void*>(p.q_nope + row * kCkv + part * 8)
                                              : static_cast<const void*>(p.q_pe + row * kKpe + (part - kCkv * 2 / 16) * 8);
      prims::cp_async16(sq + q_chunk_at<kFp8, kWg>(h, part), src, true);
    }
  }
  static_assert(kStages * C::kTk <= kThreads, "one pass loads the first kStages tiles' slots");
  if (tid < kStages * C::kTk) s_slot[tid] = slot_of(tid / C::kTk, tid % C::kTk, table_entry(tid / C::kTk, tid % C::kTk));
  __syncthreads();

  // KV tile t -> stage t % kStages: key rows [latent | rope], zero past the item's end.
  auto issue = [&](int t) {
    if (t < tiles) {
      unsigned char* st = skv + (t % kStages) * C::kStageBytes;
      const int64_t* slots = s_slot + (t % kStages) * C::kTk;
      for (int ci = tid; ci < C::kTk * C::kChunks; ci += kThreads) {
        const int r = ci / C::kChunks, part = ci % C::kChunks;
        const bool valid = it.kv_start + t * C::kTk + r < it.kv_end;
        const int64_t slot = slots[r];
        const unsigned char* src = part < C::kLatentChunks
                                       ? p.ckv + slot * (kCkv * C::kElem) + part * 16
                                       : p.kpe + slot * (kKpe * C::kElem) + (part - C::kLatentChunks) * 16;
        prims::cp_async16(st + kv_chunk_at<kFp8, kWg>(r, part), src, valid);
      }
    }
    prims::cp_async_commit();  // empty groups keep the wait count uniform
  };

  // Q rows: [q_nope 512 | q_pe 64] of heads head0 .. head0 + 63 (BF16: copied before the slots
  // are read, in tile 0's group).
  float q_factor = 1.f;  // FP8 path: Q was multiplied by this power of two
  issue(0);
  if constexpr (kFp8) q_factor = load_q_fp16<kThreads, kWg>(p, it.token, head0, sq, s_amax);
#pragma unroll
  for (int s = 1; s < kStages - 1; ++s) issue(s);

  // Scores in base 2: s * sm_scale * log2(e) (FP8: * ckv_scale / q_factor).
  const float qk_scale = p.sm_scale * kLog2e * (kFp8 ? p.ckv_scale / q_factor : 1.f);
  float o[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const unsigned char* q_rows = sq + (hb * 16) * C::kQPitch;

  for (int t = 0; t < tiles; ++t) {
    prims::cp_async_wait<kStages - 2>();
    if constexpr (kWg && kFp8) {
      // This thread's copies of tile t have landed: their codes to FP16 in conversion tile t % 2
      // (last read by tile t - 2's wgmma, which every thread finished before the previous barrier).
      const unsigned char* st = skv + (t % kStages) * C::kStageBytes;
      unsigned char* cv = sconv + (t & 1) * C::kConvBytes;
      for (int ci = tid; ci < C::kTk * C::kChunks; ci += kThreads) {
        const int r = ci / C::kChunks, part = ci % C::kChunks;  // codes of dims 16 part .. +15
        const uint4 v = *reinterpret_cast<const uint4*>(st + r * C::kRowBytes + part * 16);
        *reinterpret_cast<uint4*>(cv + core_chunk_at(r, 2 * part)) =
            uint4{prims::cvt_e4m3x2_f16x2(v.x), prims::cvt_e4m3x2_f16x2(v.x >> 16), prims::cvt_e4m3x2_f16x2(v.y),
                  prims::cvt_e4m3x2_f16x2(v.y >> 16)};
        *reinterpret_cast<uint4*>(cv + core_chunk_at(r, 2 * part + 1)) =
            uint4{prims::cvt_e4m3x2_f16x2(v.z), prims::cvt_e4m3x2_f16x2(v.z >> 16), prims::cvt_e4m3x2_f16x2(v.w),
                  prims::cvt_e4m3x2_f16x2(v.w >> 16)};
      }
    }
    if constexpr (kWg) prims::fence_proxy_async_smem();  // the tile, visible to wgmma's operand reads
    __syncthreads();  // tile t landed for everyone; everyone is done with tile t - 1's stage
    issue(t + kStages - 1);
    // Tile t + kStages's table entries, loaded now and stored as slots at the end of this
    // iteration into ring entry t % kStages (tile t's, last read by issue(t) two iterations ago),
    // where issue(t + kStages) reads them after the next iteration's barrier.
    const int32_t next_entry = tid < C::kTk ? table_entry(t + kStages, tid) : 0;
    const unsigned char* kv = skv + (t % kStages) * C::kStageBytes;
    const unsigned char* kv_op = kWg && kFp8 ? sconv + (t & 1) * C::kConvBytes : kv;  // wgmma's K / V tile

    // ---- S[16 x Tk] over this warp's half of the dims ----
    float s[C::kNT][4];
#pragma unroll
    for (int i = 0; i < C::kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const int d_begin = dh * (kQk / 2);  // 0 or 288
    if constexpr (kWg) {
      // The warpgroup's S[64 heads x 32 keys] over dims d_begin .. +287: 18 k16 steps, each two
      // core matrices along K (LBO 128 B) of every 8 rows (SBO 72 x 128 B), into s (zeroed above):
      // the m64n32 accumulator's n8 tile i is s[i].
      constexpr uint32_t kLbo = 128, kSbo = CfgWg::kDimGroups * 128;
      prims::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kQk / 2 / 16; ++ks) {
        const int dg = d_begin / 8 + 2 * ks;
        prims::wgmma_m64n32k16_ss<kFp8>(reinterpret_cast<float(&)[16]>(s), prims::smem_desc(sq + dg * 128, kLbo, kSbo),
                                        prims::smem_desc(kv_op + dg * 128, kLbo, kSbo), ks > 0);
      }
      prims::wgmma_commit();
      prims::wgmma_wait<0>();
    } else if constexpr (!kFp8) {
#pragma unroll 2
      for (int ks = 0; ks < kQk / 2 / 16; ++ks) {  // 18 k-steps of 16 dims
        const int d = d_begin + ks * 16;
        uint32_t a[4];
        {  // A: rows (lane % 8) + 8 (matrix & 1), dims d + 8 (matrix >> 1)
          const int mi = lane >> 3, r = lane & 7;
          prims::ldmatrix_x4(a, q_rows + ((mi & 1) * 8 + r) * C::kQPitch + (d + (mi >> 1) * 8) * 2);
        }
#pragma unroll
        for (int j = 0; j < C::kNT; j += 2) {  // B: keys 8j + 8 (matrix >> 1), dims d + 8 (matrix & 1)
          const int mi = lane >> 3, r = lane & 7;
          uint32_t b[4];
          prims::ldmatrix_x4(b, kv + (8 * j + (mi >> 1) * 8 + r) * C::kKvPitch + (d + (mi & 1) * 8) * 2);
          mma16816<kFp8>(s[j], a, b[0], b[1]);
          mma16816<kFp8>(s[j + 1], a, b[2], b[3]);
        }
      }
    } else {
      // FP8 keys: ldmatrix (16-bit units) over rows of 16 codes gives lane (g, c) the codes of
      // dims 4c .. 4c+3 of key g: the low two -> b0 (k slots 2c, 2c+1), the high two -> b1
      // (k slots 2c+8, +9). So within each 16-dim step, k slot 2c+e holds dim 4c+e and slot
      // 2c+8+e holds dim 4c+2+e; the A operand (Q, FP16) follows: a0|a2 = dims 4c .. 4c+3 of
      // row g (one 8 B load), a1|a3 the same of row g + 8.
#pragma unroll 1
      for (int kp = 0; kp < kQk / 2 / 32; ++kp) {  // 9 pairs of 16-dim steps
        const int d = d_begin + kp * 32;
        uint32_t a[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint2 lo = *reinterpret_cast<const uint2*>(q_rows + g * C::kQPitch + (d + h * 16 + 4 * c) * 2);
          const uint2 hi = *reinterpret_cast<const uint2*>(q_rows + (g + 8) * C::kQPitch + (d + h * 16 + 4 * c) * 2);
          a[h][0] = lo.x, a[h][2] = lo.y, a[h][1] = hi.x, a[h][3] = hi.y;
        }
#pragma unroll
        for (int j = 0; j < C::kNT; j += 2) {  // keys 8j + 8 (matrix >> 1), codes d + 16 (matrix & 1)
          const int mi = lane >> 3, r = lane & 7;
          uint32_t b[4];
          prims::ldmatrix_x4(b, kv + (8 * j + (mi >> 1) * 8 + r) * C::kKvPitch + d + (mi & 1) * 16);
          // b[0]: key tile j, dims d..; b[1]: tile j, d+16..; b[2]: tile j+1, d..; b[3]: tile j+1, d+16..
          mma16816<kFp8>(s[j], a[0], prims::cvt_e4m3x2_f16x2(b[0]), prims::cvt_e4m3x2_f16x2(b[0] >> 16));
          mma16816<kFp8>(s[j], a[1], prims::cvt_e4m3x2_f16x2(b[1]), prims::cvt_e4m3x2_f16x2(b[1] >> 16));
          mma16816<kFp8>(s[j + 1], a[0], prims::cvt_e4m3x2_f16x2(b[2]), prims::cvt_e4m3x2_f16x2(b[2] >> 16));
          mma16816<kFp8>(s[j + 1], a[1], prims::cvt_e4m3x2_f16x2(b[3]), prims::cvt_e4m3x2_f16x2(b[3] >> 16));
        }
      }
    }

    // ---- the two halves' partial S: swap through shared memory, add ----
#pragma unroll
    for (int i = 0; i < C::kNT; ++i)
      *reinterpret_cast<float4*>(sx + ((warp * C::kNT + i) * 32 + lane) * 4) = float4{s[i][0], s[i][1], s[i][2], s[i][3]};
    __syncthreads();
#pragma unroll
    for (int i = 0; i < C::kNT; ++i) {
      const float4 x = *reinterpret_cast<const float4*>(sx + (((warp ^ 4) * C::kNT + i) * 32 + lane) * 4);
      // Same order in both warps of the pair (dh 0's half first): identical sums.
      if (dh == 0) s[i][0] += x.x, s[i][1] += x.y, s[i][2] += x.z, s[i][3] += x.w;
      else s[i][0] = x.x + s[i][0], s[i][1] = x.y + s[i][1], s[i][2] = x.z + s[i][2], s[i][3] = x.w + s[i][3];
    }

    // ---- online softmax over this tile (rows g: e 0, 1; row g + 8: e 2, 3) ----
    online_softmax<C::kNT>(s, o, m_run, l_run, qk_scale, t * C::kTk, n_keys, c);

    // ---- O[16 x 256] += P[16 x Tk] . V[Tk x 256] (V = the latent, dims 256 dh ..) ----
    if constexpr (kWg) {
      // The warpgroup's O[64 x 256] += P[64 x 32] . V[32 x 256]: per k16 step (16 keys) V's core
      // matrices along N (the dims) 128 B apart (SBO), the step's two 8-key halves 72 x 128 B
      // apart (LBO), transposed (MN-major); P from registers in the A fragment.
      prims::wgmma_fence();  // o was rescaled and s rewritten by plain instructions
#pragma unroll
      for (int kk = 0; kk < C::kTk / 16; ++kk) {
        const uint32_t a[4] = {pack_p<kFp8>(s[2 * kk][0], s[2 * kk][1]), pack_p<kFp8>(s[2 * kk][2], s[2 * kk][3]),
                               pack_p<kFp8>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_p<kFp8>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const unsigned char* v = kv_op + ((2 * kk) * CfgWg::kDimGroups + dh * 32) * 128;
        prims::wgmma_m64n256k16_rs_bmn<kFp8>(reinterpret_cast<float(&)[128]>(o), a,
                                             prims::smem_desc(v, CfgWg::kDimGroups * 128, 128), true);
      }
      prims::wgmma_commit();
      prims::wgmma_wait<0>();
    } else {
#pragma unroll
      for (int kk = 0; kk < C::kTk / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack_p<kFp8>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack_p<kFp8>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack_p<kFp8>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack_p<kFp8>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const int mi = lane >> 3, r = lane & 7;
        const unsigned char* vrow = kv + (kk * 16 + (mi & 1) * 8 + r) * C::kKvPitch;  // keys 16kk + 8 (matrix & 1)
        if constexpr (!kFp8) {
#pragma unroll
          for (int nb = 0; nb < 16; ++nb) {  // 16 dims per ldmatrix: matrices (keys 0-7 | 8-15) x (dims +0 | +8)
            uint32_t b[4];
            prims::ldmatrix_x4_trans(b, vrow + (dh * 256 + nb * 16 + (mi >> 1) * 8) * 2);
            mma16816<kFp8>(o[2 * nb], a, b[0], b[1]);
            mma16816<kFp8>(o[2 * nb + 1], a, b[2], b[3]);
          }
        } else {
          // FP8 values: ldmatrix.trans in 16-bit units over [keys 0-7 | 8-15] x [codes +0 | +16]
          // gives lane (g, c) the bytes (key 2c: dims 2g, 2g+1; key 2c+1: dims 2g, 2g+1) of a
          // 16-dim block; byte_perm 0x3120 regroups them as (dim 2g: keys 2c, 2c+1 | dim 2g+1:
          // keys 2c, 2c+1): the B operand of an n8 tile whose column g is dim 2g ("even" tile)
          // and of one whose column g is dim 2g+1 ("odd" tile). o[4 nb + 0 / 1] hold the even /
          // odd tiles of dims 32 nb .. +15, o[4 nb + 2 / 3] those of dims 32 nb + 16 .. +31.
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
            uint32_t b[4];
            prims::ldmatrix_x4_trans(b, vrow + dh * 256 + nb * 32 + (mi >> 1) * 16);
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // dims 32 nb + 16 h ..
              const uint32_t k0 = __byte_perm(b[2 * h], 0u, 0x3120), k1 = __byte_perm(b[2 * h + 1], 0u, 0x3120);
              mma16816<kFp8>(o[4 * nb + 2 * h], a, prims::cvt_e4m3x2_f16x2(k0), prims::cvt_e4m3x2_f16x2(k1));
              mma16816<kFp8>(o[4 * nb + 2 * h + 1], a, prims::cvt_e4m3x2_f16x2(k0 >> 16), prims::cvt_e4m3x2_f16x2(k1 >> 16));
            }
          }
        }
      }
    }
    if (tid < C::kTk) s_slot[(t % kStages) * C::kTk + tid] = slot_of(t + kStages, tid, next_entry);
  }
  prims::cp_async_wait<0>();

  write_rows<kNaturalO, kFp8>(p, it, head0 + hb * 16 + g, dh, c, o, m_run, l_run);
}

// One CTA of 128 threads per (split token, head): out = sum_i w_i o_i / sum_i w_i with
// w_i = 2^(lse_i - max lse); lse = max + log2(sum w) (written as a natural log). Latency, not
// bytes, bounds it at small batch (a row split 32 ways at B 1), so no load waits on another:
// the threads read the parts' LSEs together (max by a block reduction), the weights go through
// shared memory a chunk of 128 parts at a time, and each thread loads kMergeBatch partial rows
// before it accumulates any. Every thread still adds the weights and rows in part order, so
// the sums are those of a serial loop.
constexpr int kMergeThreads = 128;
constexpr int kMergeBatch = 8;

__global__ void __launch_bounds__(kMergeThreads, 8) mla_merge_kernel(const Params p) {
  __shared__ float s_max[kMergeThreads / 32];
  __shared__ float s_w[kMergeThreads];
  prims::pdl_wait();
  prims::pdl_release();
  const Merge mg = p.merges ? p.merges[blockIdx.x] : device_merge(p.sched, int(blockIdx.x));
  if (mg.count <= 0) return;  // device-built schedule: the row was not split
  const int head = int(blockIdx.y), tid = int(threadIdx.x);
  const float* lse = p.part_lse + int64_t(mg.first) * p.num_heads + head;  // part i: lse[i * num_heads]
  const float* part = p.part_o + (int64_t(mg.first) * p.num_heads + head) * kCkv + tid * 4;
  const int64_t part_stride = int64_t(p.num_heads) * kCkv;
  float mx = -INFINITY;
  for (int i = tid; i < mg.count; i += kMergeThreads) mx = fmaxf(mx, lse[int64_t(i) * p.num_heads]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(prims::kFullMask, mx, o));
  if (prims::lane_id() == 0) s_max[prims::warp_id()] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kMergeThreads / 32; ++w) mx = fmaxf(mx, s_max[w]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
  auto add = [&](float w, const float4& v) {
    wsum += w;
    acc[0] += w * v.x, acc[1] += w * v.y, acc[2] += w * v.z, acc[3] += w * v.w;
  };
  for (int base = 0; base < mg.count; base += kMergeThreads) {
    const int n = mg.count - base < kMergeThreads ? mg.count - base : kMergeThreads;
    __syncthreads();  // the previous chunk's weights are read
    if (tid < n) s_w[tid] = prims::fast_exp2(lse[int64_t(base + tid) * p.num_heads] - mx);
    __syncthreads();
    const float* rows = part + int64_t(base) * part_stride;
    int i = 0;
    for (; i + kMergeBatch <= n; i += kMergeBatch) {
      float4 v[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) v[j] = *reinterpret_cast<const float4*>(rows + int64_t(i + j) * part_stride);
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) add(s_w[i + j], v[j]);
    }
    for (; i < n; ++i) add(s_w[i], *reinterpret_cast<const float4*>(rows + int64_t(i) * part_stride));
  }
  const float inv = 1.f / wsum;
  uint16_t* out = p.out + (int64_t(mg.token) * p.num_heads + head) * kCkv + tid * 4;
  *reinterpret_cast<uint2*>(out) =
      uint2{prims::pack_bf16x2(acc[0] * inv, acc[1] * inv), prims::pack_bf16x2(acc[2] * inv, acc[3] * inv)};
  if (p.lse && tid == 0) p.lse[int64_t(mg.token) * p.num_heads + head] = (mx + log2f(wsum)) * kLn2;
}

}  // namespace

}  // namespace fp4moe::cuda::attention::decode
