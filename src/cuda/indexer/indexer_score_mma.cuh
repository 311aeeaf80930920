// The indexer's score kernel (launched by indexer_score_mma.cu; run on the CPU by
// tests/cuda/indexer_score_emu_test.cpp): one CTA = one query row x a chunk of its keys. The
// row's 32 x 128 query lives in registers as mma.sync B fragments (heads = N); key tiles of 128
// keys stream through a 3-stage cp.async ring (paged gather, 16 B per copy, 16 or 8 threads per
// key row; 2 stages where a block cannot have the 3-stage 102 KB, e.g. sm_120's 99 KB); each warp
// multiplies 32 keys (two M = 16 tiles) against all 32 heads, then applies ReLU, the head weights
// and the quad reduction in registers and writes one FP32 per key.
// BF16: mma m16n8k16 (8 K-steps); FP8 E4M3: mma m16n8k32 (4 K-steps; the per-array key scale and
// d^-1/2 fold into one factor). Optionally (BF16) the query's interleaved RoPE is applied to its
// fragments as they are loaded, and the head weights read as BF16 times a scale: the runner's
// two launches before the scores, fused.
// The split of a row's keys over CTAs: tiles_per_cta > 0 fixed; 0 per token, from its length.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/kv_device.cuh"
#include "cuda/attention/kv_dims.hpp"

namespace fp4moe::cuda::indexer::score {

constexpr int kIndexHeads = attention::kIndexHeads, kIndexDim = attention::kIndexDim;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 128;                 // keys per pipeline stage
constexpr int kWarpKeys = kTileKeys / kWarps;  // 32 = two m16 tiles
constexpr int kNTiles = kIndexHeads / 8;       // 4 n8 tiles of heads
constexpr int kMaxTilesPerCta = 16;            // 2048 keys per CTA at most
static_assert(kWarpKeys == 32 && kIndexHeads == 32 && kIndexDim == 128, "tiling assumes GLM-5's 32 x 128 indexer");

template <bool kFp8, int kStages>
struct Tile {
  static constexpr int kRowBytes = kFp8 ? kIndexDim : kIndexDim * 2;
  static constexpr int kPitch = kRowBytes + 16;          // +16 B: conflict-free 32-bit fragment loads
  static constexpr int kChunksPerKey = kRowBytes / 16;   // 16 B cp.async chunks
  static constexpr int kKeysPerPass = kThreads / kChunksPerKey;
  static constexpr int kPasses = kTileKeys / kKeysPerPass;
  static constexpr int kKSteps = kFp8 ? kIndexDim / 32 : kIndexDim / 16;
  static constexpr int kStageBytes = kTileKeys * kPitch;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert((kPitch / 4) % 32 == 4, "row pitch must shift banks by 4 words per row");
  static_assert(kTileKeys % kKeysPerPass == 0, "");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "");
};

struct ScoreParams {
  const uint8_t* q;        // [T, 32, 128] elements (BF16 or E4M3)
  const float* w;          // [T, 32]
  const uint8_t* keys;     // [num_pages * page_size, 128] elements
  const int32_t* qo_indptr;
  const int32_t* positions;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int num_requests;
  int num_tokens;
  float* scores;
  int64_t score_stride;
  int page_shift;          // log2(page_size)
  int tiles_per_cta;       // key tiles of 128 per CTA; 0: per token, from its length (below)
  int resident;            // with tiles_per_cta 0: the CTAs resident on the device at once
  float scale;             // d^-1/2 (times index_scale for FP8)
  // Optional (BF16 queries): RoPE on the first rope_dim dims of each head, interleaved pairs,
  // applied to the query fragments as they are loaded.
  const float* rope_inv_freq;
  int rope_dim;
  float rope_attn_factor;
  const uint16_t* w_bf16;  // optional: BF16 head weights [T, 32] times w_scale (instead of w)
  float w_scale;
};

// The default split (host): the fewest key tiles per CTA (1..16) that keep tokens x ceil(tiles of
// max_ctx / that) CTAs within `resident` CTAs. The kernel applies the same rule per token.
inline int tiles_per_cta_for(int64_t tokens, int max_ctx, int64_t resident) {
  const int64_t tiles = (int64_t(max_ctx > 0 ? max_ctx : 0) + kTileKeys - 1) / kTileKeys;
  const int64_t r = resident > 0 ? resident : 1, want = ((tokens > 0 ? tokens : 1) * tiles + r - 1) / r;
  return int(want < 1 ? 1 : want > kMaxTilesPerCta ? kMaxTilesPerCta : want);
}

// Kernels and helpers: internal linkage (the emulator test compiles this header too).
namespace {

// An interleaved RoPE pair packed as two BF16 (low: dim 2i, high: dim 2i + 1), rotated in FP32
// and rounded back: the runner's RoPE launch's arithmetic.
__device__ __forceinline__ uint32_t rotate_bf16_pair(uint32_t v, float c, float sn) {
  const float x0 = __uint_as_float(v << 16), x1 = __uint_as_float(v & 0xffff0000u);
  return prims::pack_bf16x2(x0 * c - x1 * sn, x1 * c + x0 * sn);
}

// One pass of a CTA over its chunk of keys for kG query tokens of one request (page table
// `pages`): token u is tok[u] when on[u]. The key tiles are shared: each is loaded once and
// multiplied against every token's query; token u's scores are written for keys <= its position.
template <bool kFp8, int kStages, int kG>
__device__ __forceinline__ void score_pass(const ScoreParams& p, uint8_t* smem, const int (&tok)[kG],
                                           const bool (&on)[kG], const int32_t* pages) {
  using T = Tile<kFp8, kStages>;
  int ctx_of[kG], ctx = 0;
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    ctx_of[u] = on[u] ? p.positions[tok[u]] + 1 : 0;
    ctx = ctx_of[u] > ctx ? ctx_of[u] : ctx;
  }
  int per_cta = p.tiles_per_cta;
  if (per_cta == 0) {
    // As if every group of the batch were this long: the fewest tiles per CTA that keep the
    // batch within one wave of resident CTAs, but enough for gridDim.y CTAs to cover the row
    // (at most 16: the grid was sized for max_ctx). A graph captured at the largest context
    // thus splits shorter rows as a launch sized for them would.
    const int tiles = (ctx + kTileKeys - 1) / kTileKeys;
    const int want = int((int64_t(gridDim.x) * tiles + p.resident - 1) / p.resident);
    const int cover = (tiles + int(gridDim.y) - 1) / int(gridDim.y);
    per_cta = want > cover ? want : cover;
    per_cta = per_cta < 1 ? 1 : per_cta > kMaxTilesPerCta ? kMaxTilesPerCta : per_cta;
  }
  const int first_key = blockIdx.y * per_cta * kTileKeys;
  if (first_key >= ctx) return;  // the whole CTA
  const int left = (ctx - first_key + kTileKeys - 1) / kTileKeys;
  const int n_tiles = per_cta < left ? per_cta : left;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

  auto issue = [&](int tile) {
    if (tile < n_tiles) {
      uint8_t* st = smem + (tile % kStages) * T::kStageBytes;
      const int base = first_key + tile * kTileKeys;
#pragma unroll
      for (int pass = 0; pass < T::kPasses; ++pass) {
        const int k = pass * T::kKeysPerPass + tid / T::kChunksPerKey;
        const int part = tid % T::kChunksPerKey;
        const int j = base + k;
        const bool valid = j < ctx;
        const int64_t slot = valid ? attention::slot_of(pages, p.page_shift, j) : 0;
        prims::cp_async16(st + k * T::kPitch + part * 16, p.keys + slot * T::kRowBytes + part * 16, valid);
      }
    }
    prims::cp_async_commit();  // empty groups keep the wait count uniform
  };
  // Query fragments (B operand, col-major K x N = row-major [head][dim]), loaded before the first
  // tiles are issued: their latency then overlaps the page-table loads the copies wait on.
  uint32_t qf[kG][kNTiles][T::kKSteps][2] = {};
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    if (!on[u]) continue;
    const uint8_t* q = p.q + int64_t(tok[u]) * kIndexHeads * T::kRowBytes;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint8_t* qh = q + (nt * 8 + g) * T::kRowBytes;
#pragma unroll
      for (int ks = 0; ks < T::kKSteps; ++ks) {
        // BF16: k = ks*16 + t*2 (+8); E4M3: k = ks*32 + t*4 (+16). Byte offsets:
        const int off = kFp8 ? ks * 32 + t * 4 : (ks * 16 + t * 2) * 2;
        // The second register is 16 B further: +16 elements (E4M3) or +8 elements (BF16).
        qf[u][nt][ks][0] = *reinterpret_cast<const uint32_t*>(qh + off);
        qf[u][nt][ks][1] = *reinterpret_cast<const uint32_t*>(qh + off + 16);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  // Head weights, and the query RoPE applied to the fragments.
  float wr[kG][kNTiles][2] = {};
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    if (!on[u]) continue;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = tok[u] * kIndexHeads + nt * 8 + t * 2 + j;
        wr[u][nt][j] = (p.w_bf16 ? __uint_as_float(uint32_t(p.w_bf16[h]) << 16) * p.w_scale : p.w[h]) * p.scale;
      }
    }
    if constexpr (!kFp8) {
      if (p.rope_dim > 0) {  // register r of k-step ks holds dims ks * 16 + 2t + 8r (+1): pair i = that / 2
        const float pos = float(p.positions[tok[u]]);
#pragma unroll
        for (int ks = 0; ks < T::kKSteps; ++ks)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int d = ks * 16 + t * 2 + r * 8;
            if (d < p.rope_dim) {
              const float a = p.rope_inv_freq[d / 2] * pos;
              const float c = cosf(a) * p.rope_attn_factor, sn = sinf(a) * p.rope_attn_factor;
#pragma unroll
              for (int nt = 0; nt < kNTiles; ++nt) qf[u][nt][ks][r] = rotate_bf16_pair(qf[u][nt][ks][r], c, sn);
            }
          }
      }
    }
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    prims::cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(tile + kStages - 1);
    const uint8_t* st = smem + (tile % kStages) * T::kStageBytes;
    const int base = first_key + tile * kTileKeys;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int k0 = warp * kWarpKeys + mt * 16;  // first key of this m16 tile
      float acc[kG][kNTiles][4];
#pragma unroll
      for (int u = 0; u < kG; ++u)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) acc[u][nt][0] = acc[u][nt][1] = acc[u][nt][2] = acc[u][nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < T::kKSteps; ++ks) {
        const int off = kFp8 ? ks * 32 + t * 4 : (ks * 16 + t * 2) * 2;
        const uint8_t* r0 = st + (k0 + g) * T::kPitch + off;
        const uint8_t* r8 = r0 + 8 * T::kPitch;
        const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(r0), *reinterpret_cast<const uint32_t*>(r8),
                               *reinterpret_cast<const uint32_t*>(r0 + 16),
                               *reinterpret_cast<const uint32_t*>(r8 + 16)};
#pragma unroll
        for (int u = 0; u < kG; ++u) {
          if (!on[u]) continue;  // CTA-uniform
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            if constexpr (kFp8)
              prims::mma_e4m3_16832(acc[u][nt], a, qf[u][nt][ks][0], qf[u][nt][ks][1]);
            else
              prims::mma_bf16_16816(acc[u][nt], a, qf[u][nt][ks][0], qf[u][nt][ks][1]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kG; ++u) {
        if (!on[u]) continue;
        float s0 = 0.f, s8 = 0.f;  // keys k0 + g and k0 + g + 8, this thread's 8 heads
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          s0 += wr[u][nt][0] * fmaxf(acc[u][nt][0], 0.f) + wr[u][nt][1] * fmaxf(acc[u][nt][1], 0.f);
          s8 += wr[u][nt][0] * fmaxf(acc[u][nt][2], 0.f) + wr[u][nt][1] * fmaxf(acc[u][nt][3], 0.f);
        }
        s0 += __shfl_xor_sync(prims::kFullMask, s0, 1);
        s0 += __shfl_xor_sync(prims::kFullMask, s0, 2);
        s8 += __shfl_xor_sync(prims::kFullMask, s8, 1);
        s8 += __shfl_xor_sync(prims::kFullMask, s8, 2);
        if (t == 0) {
          float* out = p.scores + int64_t(tok[u]) * p.score_stride;
          const int j0 = base + k0 + g, j8 = j0 + 8;
          if (j0 < ctx_of[u]) out[j0] = s0;
          if (j8 < ctx_of[u]) out[j8] = s8;
        }
      }
    }
  }
  prims::cp_async_wait<0>();
}

// Grid (ceil(tokens / kG), key chunks). kG = 1: one token per CTA. kG = 2: tokens 2x and 2x + 1
// share the CTA's key tiles when they belong to one request (prefill chunks: half the key
// traffic); across a request boundary the CTA runs one pass per token.
template <bool kFp8, int kStages, int kG>
__global__ void __launch_bounds__(kThreads) index_score_kernel(const ScoreParams p) {
  static_assert(kG == 1 || kG == 2, "");
  FP4MOE_DYNAMIC_SMEM(uint8_t, smem);
  prims::pdl_wait();  // launched with PDL: the queries / keys may come from the kernel before
  prims::pdl_release();
  const int t0 = int(blockIdx.x) * kG;
  const int r0 = attention::request_of(p.qo_indptr, p.num_requests, t0);
  const int32_t* pages0 = p.page_indices + p.page_indptr[r0];
  if constexpr (kG == 1) {
    score_pass<kFp8, kStages, 1>(p, smem, {t0}, {true}, pages0);
  } else {
    const int t1 = t0 + 1;
    const bool has1 = t1 < p.num_tokens, same = has1 && t1 < p.qo_indptr[r0 + 1];
    if (!has1 || same) {
      score_pass<kFp8, kStages, 2>(p, smem, {t0, t1}, {true, has1}, pages0);
    } else {
      score_pass<kFp8, kStages, 2>(p, smem, {t0, t1}, {true, false}, pages0);
      __syncthreads();  // the ring's stages are reused
      const int r1 = attention::request_of(p.qo_indptr, p.num_requests, t1);
      score_pass<kFp8, kStages, 2>(p, smem, {t0, t1}, {false, true}, p.page_indices + p.page_indptr[r1]);
    }
  }
}

}  // namespace

}  // namespace fp4moe::cuda::indexer::score
