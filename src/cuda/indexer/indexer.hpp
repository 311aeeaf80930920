// The DSA indexer on the GPU (every arch the engine builds: sm_90a, sm_100a, sm_120a; the
// kernels use mma.sync only, BF16 m16n8k16 and FP8 E4M3 m16n8k32, which all three have).
//
//   score[t, j] = Σ_h w[t, h] · ReLU(d^-½ · q[t, h] · k_j)      for positions j <= positions[t]
//
// over the paged indexer-key cache (core/paged_kv.hpp's index_k), then the top-k (2048) per
// token. Same definition as cpu/attention/indexer_cpu.hpp (the reference): tokens are the
// rows of a KvBatchView (device pointers), token t of request r sees positions 0..p of r.
// w is FP32 and already holds weights_proj(x) · n_heads^-½ (the caller's GEMM).
//
// FP8 path: index_k in E4M3 with the per-array scale index_scale; queries quantized per
// (token, head) with the scale folded into w (quantize_q_fp8 below); FP32 accumulation. The
// scales are positive, so ReLU commutes with them:
//   score = index_scale · Σ_h (w_h · q_scale_h) · ReLU(d^-½ · q8_h · k8_j).
//
// Top-k tie rule (cpu/attention/indexer_cpu.hpp): a higher score first; equal scores -> the
// lower position first; NaN below every number. Positions are written in ascending order;
// tokens with p + 1 <= k take 0..p (the dense case); unused entries are -1.
//
// Page sizes must be powers of two (64 by default; 1 for the sparse MLA's slot view).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"
#include "cuda/attention/kv_dims.hpp"

namespace fp4moe::cuda::indexer {

inline constexpr int kIndexHeads = attention::kIndexHeads;  // 32
inline constexpr int kIndexDim = attention::kIndexDim;      // 128
inline constexpr int kMaxTopK = 4096;

struct IndexerScoreArgs {
  const void* q = nullptr;   // [T, 32, 128] BF16, or E4M3 from quantize_q_fp8 when index_k is FP8
  const float* w = nullptr;  // [T, 32] FP32 (FP8: the folded weights from quantize_q_fp8)
  KvLayerView layer;         // device: index_k [num_pages, page_size, 128] of index_elem (BF16 | FP8_E4M3)
  KvBatchView batch;         // device: qo_indptr, positions, page_indptr, page_indices
  int max_ctx = 0;           // host: >= positions[t] + 1 for every t (sizes the grid)
  float* scores = nullptr;   // [T, score_stride] FP32; columns > positions[t] are not written
  int64_t score_stride = 0;  // >= max_ctx
  // Optional, BF16 queries: their RoPE applied as they are loaded instead of by a launch before:
  // the first q_rope_dim dims of each head in interleaved pairs (2i, 2i + 1), angle
  // q_rope_inv_freq[i] * positions[t] in FP32, cos / sin * q_rope_attn_factor, each rotated pair
  // rounded to BF16 (what a separate RoPE launch would store). 0: q is used as given.
  const float* q_rope_inv_freq = nullptr;
  int q_rope_dim = 0;
  float q_rope_attn_factor = 1.0f;
  // Optional: the head weights as BF16 [T, 32] times w_bf16_scale (then w is not read).
  const void* w_bf16 = nullptr;
  float w_bf16_scale = 1.0f;
  // Key tiles of 128 keys per CTA, 1..16, for every token; 0 = the default: the grid is sized by
  // index_score_tiles_per_cta(batch.num_tokens, max_ctx, layer.index_elem), and each token's CTAs
  // split its own length the same way (as if the whole batch were that long), so a graph
  // captured at the largest context still spreads short rows over the GPU. Any value gives the
  // same scores (tests force several).
  int tiles_per_cta = 0;
  // Query tokens per CTA, 1 or 2; 0 = 2 when the batch holds at least two tokens per request
  // (prefill chunks: two consecutive tokens of a request share each key tile, half the key
  // traffic), else 1. Any value gives the same scores.
  int tokens_per_cta = 0;
  // The key ring's depth: 0 = the device's (3 stages where a block may have their shared memory,
  // else 2); 2 forces the 2-stage ring (what a 99 KB-smem arch such as sm_120 runs). Same scores.
  int ring_stages = 0;
  // Programmatic dependent launch (sm_90+, cuda/common/launch.cuh): the score kernel's blocks may
  // start launching while the kernel before it finishes, and wait for it before touching memory.
  // Off by default; bench attention measures it. Same scores.
  bool pdl = false;
};

// "" when the GPU indexer supports these dims (32 heads x 128), else why not.
std::string indexer_can_implement(int64_t num_heads, int64_t head_dim);

void index_scores(const IndexerScoreArgs& a, cudaStream_t stream);

// The score kernel's default split on the current device: the fewest key tiles per CTA (at most
// 16) that keep the grid, tokens x ceil(max_ctx / 128 / tiles) CTAs, within one wave of resident
// CTAs. A CTA's start is a chain of dependent loads (its position, request, page table, then the
// keys); with several tiles per CTA it is paid once and the tiles stream through the CTA's
// cp.async ring, where one tile per CTA (several waves) paid it per tile.
int index_score_tiles_per_cta(int64_t tokens, int max_ctx, KvElem index_elem, int tokens_per_cta = 1);

// q_bf16 [T, 32, 128] -> q_fp8 [T, 32, 128] E4M3 (RNE, saturating) with scale_h = amax_h / 448
// (1 for an all-zero head), and w_fp8[t, h] = w[t, h] · scale_h.
void quantize_q_fp8(const void* q_bf16, const float* w, void* q_fp8, float* w_fp8, int64_t tokens,
                    cudaStream_t stream);

struct TopKArgs {
  const float* scores = nullptr;  // [T, score_stride]
  int64_t score_stride = 0;       // >= max_ctx
  KvBatchView batch;              // device: qo_indptr, positions (+ page_indptr / page_indices for slots)
  int max_ctx = 0;                // host: >= positions[t] + 1 for every t (keys beyond it are ignored)
  int top_k = 2048;
  int32_t* out_pos = nullptr;     // [T, top_k] selected positions (ascending), -1 padded
  // Optional: the same selection as cache slots (kv_slot), -1 padded: the page table of the
  // sparse MLA (MlaSm90::plan_sparse, page_size 1). Null to skip.
  int32_t* out_slot = nullptr;
  int64_t page_size = attention::kDefaultPageSize;  // with out_slot
  // Device scratch for rows longer than 16K keys: top_k_workspace_bytes(T, max_ctx) bytes (0 when
  // max_ctx <= 16384), zeroed once after allocation (one_cta_keys 32768: only rows longer than
  // that use it). Each call leaves all of it zero, so calls of any row count and max_ctx within
  // its size may share it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Optional diagnostics, device [T]: each row longer than 16K keys gets its candidate count
  // (top_k..8192: selected among the candidates; else its sample missed and the row was streamed).
  // Other rows' entries are not written. top_k_sample_stats reads it.
  int32_t* candidate_counts = nullptr;
  // Rows longer than 16K keys: keys per gather CTA, a multiple of 4096 up to 65536; 0 = 4096.
  // top_k_slice_keys(T, max_ctx) is the wider choice for many long rows (measured side by side
  // in `bench attention`'s top-k rows).
  int slice_keys = 0;
  // Rows longer than 16K keys: the most lines of 32 keys the candidate threshold's sample takes
  // (one line of every ctx / 32 / sample_lines), 32..256; 0 = 256. A smaller sample is cheaper to
  // read and narrow, and admits more candidates (bench attention's "ours-radix-sample<n>" rows).
  int sample_lines = 0;
  // Rows of up to this many keys take the one-CTA path (the row in shared memory, one launch):
  // 16384 (0: the default, every arch) or 32768 (145 KB of shared memory per block: sm_90 /
  // sm_100; an Error where a block may not have it). Longer rows take the sampled path (two
  // launches). Same selection (bench attention's "ours-radix-1cta32k" rows).
  int one_cta_keys = 0;
  // Programmatic dependent launch (sm_90+, cuda/common/launch.cuh) for both top-k kernels: each
  // may start launching while the kernel before it finishes, and waits for it before touching
  // memory. Off by default; bench attention measures it. Same selection.
  bool pdl = false;
};

inline constexpr int kMaxTopKContext = 1 << 22;  // positions < 4M

size_t top_k_workspace_bytes(int64_t rows, int max_ctx);
// The largest TopKArgs::one_cta_keys this device's shared memory allows: 32768 or 16384.
int top_k_max_one_cta_keys();
// The smallest multiple of 4096 keys per CTA that keeps rows x slices within two CTAs per SM of
// the current device (at most 65536).
int top_k_slice_keys(int64_t rows, int max_ctx);

// Radix select (cuda/indexer/topk_radix.cuh): rows of <= 16K keys in one CTA each (keys read
// once into shared memory, <= 3 histogram passes, one ordered write); longer rows in two
// launches: a candidate threshold from a sample of the row (one CTA per row), then CTAs of 4K
// keys (TopKArgs::slice_keys) gathering the keys above it, the row's last one selecting among
// them and writing the selection in order.
// At most 65535 rows per call.
void top_k(const TopKArgs& a, cudaStream_t stream);

// The indexer key of each new token, in one launch (index_key_prep.cuh): LayerNorm (weight,
// bias, eps) over its 128 dims, RoPE on the first rope_dim (interleaved pairs or halves; angle
// inv_freq[i] * position in FP32, cos / sin * attn_factor), then the write into its slot of
// layer.index_k (BF16, or E4M3 of x / index_scale). FP32 throughout, one rounding at the write
// (the CPU model's order). Replaces a LayerNorm launch, a RoPE launch and the index part of the
// cache append. Slots outside the pool are skipped, not written.
struct IndexKeyPrepArgs {
  const void* k = nullptr;  // [T, k_stride] BF16: the wk projection of the new tokens
  int64_t k_stride = 128;
  const float* ln_w = nullptr;  // [128]
  const float* ln_b = nullptr;  // [128]
  float eps = 1e-6f;
  int rope_dim = 64;
  bool interleaved = true;
  const float* inv_freq = nullptr;  // [rope_dim / 2]
  float attn_factor = 1.0f;
  KvLayerView layer;  // index_k, index_dim 128, index_elem BF16 or FP8_E4M3 (index_scale)
  KvBatchView batch;  // device: qo_indptr, positions, page_indptr, page_indices
};
// Empty when it can run (128 dims, rope_dim even and <= 128, a multiple of 8 for halves), else why not.
std::string index_key_prep_can_implement(int64_t dim, int rope_dim, bool interleaved);
void index_key_prep(const IndexKeyPrepArgs& a, cudaStream_t stream);

// Diagnostics (benchmarks, tests; synchronizes the stream): how many rows longer than 16K keys
// the last top_k call with these args (candidate_counts set) selected by streaming the whole row
// (its sample missed: fewer than top_k or more than 8192 candidates), and the median candidate
// count of those rows.
struct TopKSampleStats {
  int long_rows = 0, streamed = 0;
  int median_candidates = 0;
};
TopKSampleStats top_k_sample_stats(const TopKArgs& a, cudaStream_t stream);

}  // namespace fp4moe::cuda::indexer
