// The indexer's score kernel: one CTA = one query row x a chunk of its keys. The row's 32 x 128
// query lives in registers as mma.sync B fragments (heads = N); key tiles of 128 keys stream
// through a 3-stage cp.async ring (paged gather, 16 B per copy, 16 or 8 threads per key row);
// (2 stages where a block cannot have the 3-stage 102 KB, e.g. sm_120's 99 KB);
// each warp multiplies 32 keys (two M = 16 tiles) against all 32 heads, then applies
// ReLU, the head weights and the quad reduction in registers and writes one FP32 per key.
// BF16: mma m16n8k16 (8 K-steps); FP8 E4M3: mma m16n8k32 (4 K-steps; the per-array key scale
// and d^-1/2 fold into one factor). Optionally (BF16) the query's interleaved RoPE is applied to
// its fragments as they are loaded, and the head weights read as BF16 times a scale: the
// runner's two launches before the scores, fused.
// Compiled for every arch in CMAKE_CUDA_ARCHITECTURES (sm_90a, sm_100a, sm_120a).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/attention/kv_device.cuh"
#include "cuda/common/cuda_check.hpp"
#include "cuda/indexer/indexer.hpp"
#include "core/error.hpp"
#include "cuda/common/device.hpp"

namespace fp4moe::cuda::indexer {
namespace {

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

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct ScoreParams {
  const uint8_t* q;        // [T, 32, 128] elements (BF16 or E4M3)
  const float* w;          // [T, 32]
  const uint8_t* keys;     // [num_pages * page_size, 128] elements
  const int32_t* qo_indptr;
  const int32_t* positions;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int num_requests;
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

// An interleaved RoPE pair packed as two BF16 (low: dim 2i, high: dim 2i + 1), rotated in FP32
// and rounded back: the runner's RoPE launch's arithmetic.
__device__ __forceinline__ uint32_t rotate_bf16_pair(uint32_t v, float c, float sn) {
  const float x0 = __uint_as_float(v << 16), x1 = __uint_as_float(v & 0xffff0000u);
  const __nv_bfloat16 y0 = __float2bfloat16(x0 * c - x1 * sn), y1 = __float2bfloat16(x1 * c + x0 * sn);
  return uint32_t(__bfloat16_as_ushort(y0)) | (uint32_t(__bfloat16_as_ushort(y1)) << 16);
}

template <bool kFp8, int kStages>
__global__ void __launch_bounds__(kThreads) index_score_kernel(const ScoreParams p) {
  using T = Tile<kFp8, kStages>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int row = blockIdx.x;  // flat token
  const int ctx = p.positions[row] + 1;
  int per_cta = p.tiles_per_cta;
  if (per_cta == 0) {
    // As if every token of the batch had this one's length: the fewest tiles per CTA that keep
    // the batch within one wave of resident CTAs, but enough for gridDim.y CTAs to cover the row
    // (at most 16: the grid was sized for max_ctx). A graph captured at the largest context
    // thus splits shorter rows as a launch sized for them would.
    const int tiles = (ctx + kTileKeys - 1) / kTileKeys;
    const int want = int((int64_t(gridDim.x) * tiles + p.resident - 1) / p.resident);
    const int cover = (tiles + int(gridDim.y) - 1) / int(gridDim.y);
    per_cta = min(max(max(want, cover), 1), kMaxTilesPerCta);
  }
  const int first_key = blockIdx.y * per_cta * kTileKeys;
  if (first_key >= ctx) return;
  const int n_tiles = min(per_cta, (ctx - first_key + kTileKeys - 1) / kTileKeys);
  const int req = attention::request_of(p.qo_indptr, p.num_requests, row);
  const int32_t* pages = p.page_indices + p.page_indptr[req];
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
        cp_async16(st + k * T::kPitch + part * 16, p.keys + slot * T::kRowBytes + part * 16, valid);
      }
    }
    cp_async_commit();  // empty groups keep the wait count uniform
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  // Query fragments (B operand, col-major K x N = row-major [head][dim]) and head weights.
  uint32_t qf[kNTiles][T::kKSteps][2];
  float wr[kNTiles][2];
  {
    const uint8_t* q = p.q + int64_t(row) * kIndexHeads * T::kRowBytes;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint8_t* qh = q + (nt * 8 + g) * T::kRowBytes;
#pragma unroll
      for (int ks = 0; ks < T::kKSteps; ++ks) {
        // BF16: k = ks*16 + t*2 (+8); E4M3: k = ks*32 + t*4 (+16). Byte offsets:
        const int off = kFp8 ? ks * 32 + t * 4 : (ks * 16 + t * 2) * 2;
        // The second register is 16 B further: +16 elements (E4M3) or +8 elements (BF16).
        qf[nt][ks][0] = *reinterpret_cast<const uint32_t*>(qh + off);
        qf[nt][ks][1] = *reinterpret_cast<const uint32_t*>(qh + off + 16);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = row * kIndexHeads + nt * 8 + t * 2 + j;
        wr[nt][j] = (p.w_bf16 ? __uint_as_float(uint32_t(p.w_bf16[h]) << 16) * p.w_scale : p.w[h]) * p.scale;
      }
    }
    if constexpr (!kFp8) {
      if (p.rope_dim > 0) {  // register r of k-step ks holds dims ks * 16 + 2t + 8r (+1): pair i = that / 2
        const float pos = float(p.positions[row]);
#pragma unroll
        for (int ks = 0; ks < T::kKSteps; ++ks)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int d = ks * 16 + t * 2 + r * 8;
            if (d < p.rope_dim) {
              const float a = p.rope_inv_freq[d / 2] * pos;
              const float c = cosf(a) * p.rope_attn_factor, sn = sinf(a) * p.rope_attn_factor;
#pragma unroll
              for (int nt = 0; nt < kNTiles; ++nt) qf[nt][ks][r] = rotate_bf16_pair(qf[nt][ks][r], c, sn);
            }
          }
      }
    }
  }
  float* out = p.scores + int64_t(row) * p.score_stride;

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(tile + kStages - 1);
    const uint8_t* st = smem + (tile % kStages) * T::kStageBytes;
    const int base = first_key + tile * kTileKeys;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int k0 = warp * kWarpKeys + mt * 16;  // first key of this m16 tile
      float acc[kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < T::kKSteps; ++ks) {
        const int off = kFp8 ? ks * 32 + t * 4 : (ks * 16 + t * 2) * 2;
        const uint8_t* r0 = st + (k0 + g) * T::kPitch + off;
        const uint8_t* r8 = r0 + 8 * T::kPitch;
        const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(r0), *reinterpret_cast<const uint32_t*>(r8),
                               *reinterpret_cast<const uint32_t*>(r0 + 16),
                               *reinterpret_cast<const uint32_t*>(r8 + 16)};
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          if constexpr (kFp8)
            mma_e4m3(acc[nt], a, qf[nt][ks][0], qf[nt][ks][1]);
          else
            mma_bf16(acc[nt], a, qf[nt][ks][0], qf[nt][ks][1]);
        }
      }
      float s0 = 0.f, s8 = 0.f;  // keys k0 + g and k0 + g + 8, this thread's 8 heads
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        s0 += wr[nt][0] * fmaxf(acc[nt][0], 0.f) + wr[nt][1] * fmaxf(acc[nt][1], 0.f);
        s8 += wr[nt][0] * fmaxf(acc[nt][2], 0.f) + wr[nt][1] * fmaxf(acc[nt][3], 0.f);
      }
      s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      s8 += __shfl_xor_sync(0xffffffffu, s8, 1);
      s8 += __shfl_xor_sync(0xffffffffu, s8, 2);
      if (t == 0) {
        const int j0 = base + k0 + g, j8 = j0 + 8;
        if (j0 < ctx) out[j0] = s0;
        if (j8 < ctx) out[j8] = s8;
      }
    }
  }
  cp_async_wait<0>();
}

__global__ void quantize_q_fp8_kernel(const __nv_bfloat16* q, const float* w, __nv_fp8_e4m3* q8, float* w8,
                                      int rows) {
  // One warp per (row, head): 128 values, 4 per lane.
  const int rh = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (rh >= rows * kIndexHeads) return;
  const int lane = threadIdx.x & 31;
  const __nv_bfloat16* src = q + int64_t(rh) * kIndexDim + lane * 4;
  float v[4], amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = __bfloat162float(src[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  const float inv = 1.f / scale;
#pragma unroll
  for (int i = 0; i < 4; ++i) q8[int64_t(rh) * kIndexDim + lane * 4 + i] = __nv_fp8_e4m3(v[i] * inv);
  if (lane == 0) w8[rh] = w[rh] * scale;
}

// Per-device facts, read once per device (cuda/common/device: index_scores runs every decode step).
struct DeviceFacts {
  int sms = 0, smem_optin = 0;
};
DeviceFacts device_facts() {
  const cuda::DeviceInfo& d = cuda::current_device();
  return {d.sm_count, int(d.smem_per_block_optin)};
}

// The kernel's opt-in to its shared memory and its resident CTAs per SM, once per device.
template <bool kFp8, int kStages>
int ctas_per_sm() {
  using T = Tile<kFp8, kStages>;
  static cuda::DeviceOnce once;
  static int per_sm[cuda::kMaxDevices] = {};
  const int dev = cuda::current_device_ordinal();
  once([dev] {
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(index_score_kernel<kFp8, kStages>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
    int n = 0;
    FP4MOE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, index_score_kernel<kFp8, kStages>, kThreads, T::kSmemBytes));
    per_sm[dev] = std::max(n, 1);
  });
  return per_sm[dev];
}

// The ring depth this device runs: 3 stages where a block may have their shared memory (and
// FP4MOE_INDEXER_STAGES=2 does not force 2: tests cover both on one GPU).
bool three_stages(bool fp8) {
  const char* force = std::getenv("FP4MOE_INDEXER_STAGES");
  if (force && std::string(force) == "2") return false;
  return device_facts().smem_optin >= int(fp8 ? Tile<true, 3>::kSmemBytes : Tile<false, 3>::kSmemBytes);
}

int resident_ctas(bool fp8) {
  const int per_sm = three_stages(fp8) ? (fp8 ? ctas_per_sm<true, 3>() : ctas_per_sm<false, 3>())
                                       : (fp8 ? ctas_per_sm<true, 2>() : ctas_per_sm<false, 2>());
  return device_facts().sms * per_sm;
}

template <bool kFp8, int kStages>
void launch_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  using T = Tile<kFp8, kStages>;
  ctas_per_sm<kFp8, kStages>();  // the shared-memory opt-in
  const int key_tiles = (a.max_ctx + kTileKeys - 1) / kTileKeys;
  // The grid: for max_ctx (the forced split, or the default one of the longest row).
  const int tiles_per_cta =
      a.tiles_per_cta > 0 ? a.tiles_per_cta : index_score_tiles_per_cta(a.batch.num_tokens, a.max_ctx, a.layer.index_elem);
  ScoreParams p{};
  p.q = static_cast<const uint8_t*>(a.q);
  p.w = a.w;
  p.keys = static_cast<const uint8_t*>(a.layer.index_k);
  p.qo_indptr = a.batch.qo_indptr;
  p.positions = a.batch.positions;
  p.page_indptr = a.batch.page_indptr;
  p.page_indices = a.batch.page_indices;
  p.num_requests = int(a.batch.num_requests);
  p.scores = a.scores;
  p.score_stride = a.score_stride;
  p.page_shift = attention::log2_exact(a.layer.page_size);
  p.tiles_per_cta = a.tiles_per_cta;  // 0: each CTA takes its token's split
  p.resident = resident_ctas(kFp8);
  p.scale = 1.0f / sqrtf(float(kIndexDim)) * (kFp8 ? a.layer.index_scale : 1.0f);
  p.rope_inv_freq = a.q_rope_inv_freq;
  p.rope_dim = a.q_rope_dim;
  p.rope_attn_factor = a.q_rope_attn_factor;
  p.w_bf16 = static_cast<const uint16_t*>(a.w_bf16);
  p.w_scale = a.w_bf16_scale;
  const dim3 grid(unsigned(a.batch.num_tokens), unsigned((key_tiles + tiles_per_cta - 1) / tiles_per_cta));
  index_score_kernel<kFp8, kStages><<<grid, kThreads, T::kSmemBytes, stream>>>(p);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::string indexer_can_implement(int64_t num_heads, int64_t head_dim) {
  if (num_heads != kIndexHeads || head_dim != kIndexDim)
    return "indexer: " + std::to_string(num_heads) + " heads x " + std::to_string(head_dim) +
           " unsupported (the GPU indexer is built for 32 heads x 128)";
  return "";
}

void index_scores(const IndexerScoreArgs& a, cudaStream_t stream) {
  const KvLayerView& L = a.layer;
  const KvBatchView& b = a.batch;
  FP4MOE_CHECK(a.q && (a.w || a.w_bf16) && L.index_k && a.scores && b.qo_indptr && b.positions && b.page_indptr &&
                   b.page_indices,
               "{}", "indexer scores: a required pointer is null");
  FP4MOE_CHECK(a.q_rope_dim == 0 || (L.index_elem == KvElem::BF16 && a.q_rope_inv_freq && a.q_rope_dim > 0 &&
                                     a.q_rope_dim <= kIndexDim && a.q_rope_dim % 2 == 0),
               "indexer scores: the fused query RoPE takes BF16 queries and an even rope_dim <= 128 (got {})",
               a.q_rope_dim);
  const std::string why = indexer_can_implement(kIndexHeads, L.index_dim);
  FP4MOE_CHECK(why.empty(), "{}", why);
  FP4MOE_CHECK(L.index_elem == KvElem::BF16 || L.index_elem == KvElem::FP8_E4M3, "{}",
          "indexer scores: index_k must be bf16 or fp8_e4m3");
  FP4MOE_CHECK(attention::log2_exact(L.page_size) >= 0, "{}",
          "indexer scores: page_size " + std::to_string(L.page_size) + " must be a power of two");
  FP4MOE_CHECK(b.num_tokens >= 0 && b.num_tokens < (int64_t(1) << 31) && b.num_requests >= 1, "{}",
          "indexer scores: bad token / request count");
  FP4MOE_CHECK(a.max_ctx >= 0 && a.max_ctx <= 65535 * kTileKeys, "{}", "indexer scores: max_ctx out of range");
  FP4MOE_CHECK(a.score_stride >= a.max_ctx, "{}", "indexer scores: score_stride < max_ctx");
  if (b.num_tokens == 0 || a.max_ctx == 0) return;
  FP4MOE_CHECK(a.tiles_per_cta >= 0 && a.tiles_per_cta <= kMaxTilesPerCta, "indexer scores: tiles_per_cta {} outside [0, {}]",
               a.tiles_per_cta, kMaxTilesPerCta);
  const bool three = three_stages(L.index_elem == KvElem::FP8_E4M3);
  if (L.index_elem == KvElem::BF16)
    three ? launch_scores<false, 3>(a, stream) : launch_scores<false, 2>(a, stream);
  else
    three ? launch_scores<true, 3>(a, stream) : launch_scores<true, 2>(a, stream);
}

int index_score_tiles_per_cta(int64_t tokens, int max_ctx, KvElem index_elem) {
  const int64_t key_tiles = (int64_t(std::max(max_ctx, 0)) + kTileKeys - 1) / kTileKeys;
  const int64_t total = key_tiles * std::max<int64_t>(tokens, 1);
  const int64_t slots = resident_ctas(index_elem == KvElem::FP8_E4M3);
  return int(std::clamp<int64_t>((total + slots - 1) / slots, 1, kMaxTilesPerCta));
}

void quantize_q_fp8(const void* q_bf16, const float* w, void* q_fp8, float* w_fp8, int64_t tokens,
                    cudaStream_t stream) {
  if (tokens <= 0) return;
  FP4MOE_CHECK(tokens <= (int64_t(1) << 24), "{}", "quantize_q_fp8: too many tokens");
  const int rows = int(tokens);
  const int warps = rows * kIndexHeads;
  constexpr int kBlock = 256;
  quantize_q_fp8_kernel<<<(warps * 32 + kBlock - 1) / kBlock, kBlock, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(q_bf16), w, static_cast<__nv_fp8_e4m3*>(q_fp8), w_fp8, rows);
  FP4MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::cuda::indexer
