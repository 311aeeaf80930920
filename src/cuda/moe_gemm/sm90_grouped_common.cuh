// Pieces both sm_90a grouped-GEMM kernels share (sm90_nvfp4_grouped_gemm.cuh: wgmma,
// sm90_nvfp4_grouped_gemm_decode.cuh: mma.sync): parameters, the register decode of a K step,
// the device-side tile schedule, the producer (one thread: weight chunks by cp.async.bulk,
// activations by TMA, on a ring of full / empty mbarriers), split-K, and the epilogue.
//
// Both kernels read the same re-laid weights (sm90_tile_layout.hpp) and hold accumulators in
// the same per-warp fragment order: for each 8-token block i of the tile, acc[4i + h] is
// (row r0 = g, token 8i + 2t + h) and acc[4i + 2 + h] is (row r1 = g + 8, same token), where
// g = lane / 4, t = lane % 4 and the warp's 16 rows are rows 16 w .. 16 w + 15 of the 128-row
// tile (w = consumer warp 0..7). That is wgmma's m64nN layout per warp and mma.sync's
// m16n8 layout per 8 tokens.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "core/gemm_epilogue.hpp"
#include "cuda/moe_gemm/sm90_fp4_word.hpp"
#include "cuda/moe_gemm/sm90_ptx.cuh"
#include "cuda/moe_gemm/sm90_tile_layout.hpp"

namespace fp4moe::cuda::sm90 {

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
  int force_splits = 0;                  // > 0: use this split factor (measurements), else pick
  int num_experts = 0, n = 0, k = 0, y_ld = 0, stages = 0;
  int epilogue = 0;                      // int(Epilogue), core/gemm_epilogue.hpp
  int mxfp4 = 0;
};

// Decodes one K step: `w` = the 8 codes of the thread's A fragment (sm90_fp4_word.hpp),
// s2 = {S(r0), S(r1)}: registers 0, 2 (row r0) multiply by the low half, 1, 3 (row r1) by the
// high half, through HMUL2's operand selector (no PRMT).
__device__ __forceinline__ void decode_kstep(uint32_t w, uint32_t s2, uint32_t (&a)[4]) {
  uint32_t r[4];
  fp4_word_to_bf16x2(w, r);
  a[0] = mul_bf16x2_lo(r[0], s2);
  a[1] = mul_bf16x2_hi(r[1], s2);
  a[2] = mul_bf16x2_lo(r[2], s2);
  a[3] = mul_bf16x2_hi(r[3], s2);
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
// waves(S) * (k_tiles / S + 16) (16 K stages: the partial round trip, its fence and barriers,
// calibrated on the H200's decode split sweep, bench/RESULTS.md); S = 1 unless a split is
// >= 3 % better. Plain integer/float math: the host tests can call it too.
__host__ __device__ inline int sm90_pick_splits(int tiles, int slots, int k_tiles, int max_splits, int cap_units) {
  int best_s = 1;
  const auto cost = [&](int s) {
    const long long units = (long long)tiles * s;
    const long long waves = (units + slots - 1) / slots;
    return float(waves) * (float(k_tiles) / float(s) + 16.0f);
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

// Named barrier 1 over the 256 consumer threads (both kernels have 8 consumer warps).
__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

struct Sm90Schedule {
  int total_units;  // unit u = tile u / splits, K part u % splits
  int splits;
};

// Shared-memory carve-up of both kernels (sm90_smem_layout): B stages, weight chunks,
// barriers, the scheduler's prefix / split count / split flag.
struct Sm90Smem {
  uint8_t* b;            // [stages][kBlockN][64] bf16, 128-byte swizzled
  uint8_t* chunk;        // [stages][4608]
  uint64_t* full;        // [stages]
  uint64_t* empty;       // [stages]
  int* prefix;           // [E + 1], then the split count
  volatile int* split_flag;
};
__device__ __forceinline__ Sm90Smem carve_smem(uint8_t* smem_raw, const Sm90SmemLayout& L) {
  // Realign to 1024 B by offsetting the __shared__ array itself (keeps shared-space loads).
  uint8_t* smem = smem_raw + ((kSwizzleAlign - (smem_u32(smem_raw) & (kSwizzleAlign - 1))) & (kSwizzleAlign - 1));
  Sm90Smem s;
  s.b = smem + L.b_offset;
  s.chunk = smem + L.chunk_offset;
  s.full = reinterpret_cast<uint64_t*>(smem + L.barrier_offset);
  s.empty = s.full + L.stages;
  s.prefix = reinterpret_cast<int*>(smem + L.sched_offset);
  s.split_flag = s.prefix + L.num_experts + 2;
  return s;
}

// Called by every thread: warp 0 turns the per-expert counts into the prefix of tile counts,
// thread 0 agrees the split factor and initializes the barriers (`empty` completes after
// `empty_arrivals` consumer arrivals). Ends with __syncthreads.
template <int kBlockN>
__device__ __forceinline__ Sm90Schedule schedule_prologue(const GroupedGemmParams& p, const Sm90Smem& s,
                                                          int empty_arrivals, const CUtensorMap* tmap) {
  const int tid = threadIdx.x;
  const int row_tiles = p.n / kBlockM;
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
      if (e < p.num_experts) s.prefix[e + 1] = running + v;
      running += __shfl_sync(0xffffffffu, v, 31);
    }
    if (tid == 0) {
      s.prefix[0] = 0;
      int splits = 1;
      if (p.partials && p.counters && p.max_splits > 1) {
        splits = sm90_pick_splits(running, int(gridDim.x), p.k / kBlockK, p.max_splits, p.split_cap_units);
        if (p.force_splits > 0)
          splits = max(1, min(min(p.force_splits, p.k / kBlockK), running > 0 ? p.split_cap_units / running : 1));
      }
      s.prefix[p.num_experts + 1] = splits;
      for (int i = 0; i < p.stages; ++i) {
        mbar_init(&s.full[i], 1);
        mbar_init(&s.empty[i], empty_arrivals);
      }
      fence_barrier_init();
      prefetch_tensor_map(tmap);
    }
  }
  __syncthreads();
  const int splits = s.prefix[p.num_experts + 1];
  return {s.prefix[p.num_experts] * splits, splits};
}

// The K-stage range [begin, end) of split `part`.
__device__ __forceinline__ int split_begin(int part, int k_tiles, int splits) { return part * k_tiles / splits; }

// The producer (one thread): per K stage, one cp.async.bulk of the 4608-byte weight chunk
// (evict-first: streamed once) and one TMA of the {64, kBlockN} activation box, both on
// full[s]; waits for empty[s] before reusing a slot.
template <int kBlockN>
__device__ __forceinline__ void produce(const GroupedGemmParams& p, const CUtensorMap* tmap, const Sm90Smem& s,
                                        Sm90Schedule sched) {
  const int row_tiles = p.n / kBlockM;
  const int k_tiles = p.k / kBlockK;
  const uint64_t policy = policy_evict_first();
  const uint32_t stage_tx = kChunkBytes + kBlockN * kBlockK * 2;
  int slot = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < sched.total_units; u += gridDim.x) {
    const int t = u / sched.splits, part = u - t * sched.splits;
    const TileCoord c = tile_coord(s.prefix, p.num_experts, row_tiles, t);
    const int row0 = p.offsets[c.expert] + c.token_tile * kBlockN;
    const uint8_t* src = p.tiles + (size_t(c.expert) * row_tiles + c.row_tile) * size_t(k_tiles) * kChunkBytes;
    const int kt_end = split_begin(part + 1, k_tiles, sched.splits);
    for (int kt = split_begin(part, k_tiles, sched.splits); kt < kt_end; ++kt) {
      mbar_wait(&s.empty[slot], phase ^ 1u);
      mbar_arrive_expect_tx(&s.full[slot], stage_tx);
      bulk_copy_g2s(s.chunk + size_t(slot) * kChunkBytes, src + size_t(kt) * kChunkBytes, kChunkBytes, &s.full[slot],
                    policy);
      tma_load_2d(s.b + size_t(slot) * kBlockN * kBlockK * 2, tmap, kt * kBlockK, row0, &s.full[slot]);
      if (++slot == p.stages) {
        slot = 0;
        phase ^= 1u;
      }
    }
  }
}

// Split-K (sched.splits > 1): every unit stores its FP32 accumulators to the workspace; the
// tile's last unit to arrive (per-tile counter) sums all partials in split order (the result
// does not depend on arrival order) into `acc` and returns true; the others return false.
// The sum re-reads the unit's own partial too, so it needs no second accumulator array.
// Called by the 256 consumer threads (ctid = 0..255).
template <int kAcc>
__device__ __forceinline__ bool split_k_merge(const GroupedGemmParams& p, float (&acc)[kAcc], int u, int t,
                                              int splits, int ctid, volatile int* flag) {
  float4* part_buf = reinterpret_cast<float4*>(p.partials);
  constexpr int kVec = kAcc / 4;
#pragma unroll
  for (int i = 0; i < kVec; ++i)
    __stcg(part_buf + (size_t(u) * kVec + i) * 256 + ctid,
           make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  __threadfence();
  consumer_bar();
  if (ctid == 0) *flag = atomicAdd(p.counters + t, 1) == splits - 1 ? 1 : 0;
  consumer_bar();
  if (*flag == 0) return false;  // another unit of this tile finishes it
  __threadfence();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int sp = 0; sp < splits; ++sp) {  // fixed order
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float4 v = __ldcg(part_buf + (size_t(t * splits + sp) * kVec + i) * 256 + ctid);
      acc[4 * i] += v.x;
      acc[4 * i + 1] += v.y;
      acc[4 * i + 2] += v.z;
      acc[4 * i + 3] += v.w;
    }
  }
  if (ctid == 0) p.counters[t] = 0;  // ready for the next launch (the launcher also zeroes)
  return true;
}

// Epilogue, registers -> global (bf16), for consumer warp w (0..7) of the tile `c`, in the
// fragment order above. Only tokens of the tile's expert are stored.
template <int kAcc>
__device__ __forceinline__ void store_tile(const GroupedGemmParams& p, const float (&acc)[kAcc], TileCoord c,
                                           int token_block, int w, int lane) {
  const int g = lane / 4, t4 = lane % 4;
  const int e = c.expert;
  const int m_begin = p.offsets[e];
  const int m_count = p.offsets[e + 1] - m_begin;
  const float act_g = p.act_global ? *p.act_global : 1.0f;
  const float alpha = (p.mxfp4 ? 1.0f : p.global_scale[e]) * act_g * float(1 << kEpilogueScaleLog2);
  const int tok0 = c.token_tile * token_block;
#pragma unroll
  for (int i = 0; i < kAcc / 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = tok0 + 8 * i + 2 * t4 + h;
      if (tok >= m_count) continue;
      const size_t m = size_t(m_begin + tok);
      float v0 = acc[4 * i + h] * alpha;      // fragment row r0
      float v1 = acc[4 * i + 2 + h] * alpha;  // fragment row r1
      if (p.epilogue == int(Epilogue::SiluMul)) {
        const int f = 64 * c.row_tile + 8 * w + g;
        const float silu = v0 / (1.0f + __expf(-v0));
        p.y[m * p.y_ld + f] = __float2bfloat16_rn(silu * v1);
      } else {
        if (p.epilogue == int(Epilogue::RowScale)) {
          const float rs = p.row_scale[m];
          v0 *= rs;
          v1 *= rs;
        }
        const int f = kBlockM * c.row_tile + 16 * w + 2 * g;
        *reinterpret_cast<__nv_bfloat162*>(p.y + m * p.y_ld + f) = __floats2bfloat162_rn(v0, v1);
      }
    }
  }
}

}  // namespace fp4moe::cuda::sm90
