// MLA prefill in the EXPANDED form on SM90 (the absorbed form is MlaSm90 in mla.hpp): the
// cached latent of every context token is expanded per head by the checkpoint's kv_b_proj,
//   k_h = [W_UK_h · ckv (192) | kpe (64)],   v_h = W_UV_h · ckv (256),
// and FlashInfer 0.7.2.post1's FA3 ragged prefill (head_dim 256 / 256, causal) runs on them:
//   out[t, h] = softmax_j(sm_scale · q[t, h] · k_{j,h}) · v_{j,h}        (256 wide, before o_proj)
// Attention flops per (query, key, head): 2 · (256 + 256), against 2 · (576 + 512) absorbed, plus
// the expansion GEMM (2 · 512 · 64 · 448 per context token) — so the expanded form wins once
// the queries per context token are many (long prefill chunks); the bench measures both.
// Same batch rules as MlaSm90::plan (the new tokens are the last q_len positions of each
// request); the KV cache may be BF16 or FP8 (dequantized while gathered). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/paged_kv.hpp"

namespace fp4moe::cuda::attention {

inline constexpr int kQkNopeDim = 192;  // qk_nope_head_dim
inline constexpr int kVDim = 256;       // v_head_dim
inline constexpr int kExpandedHeadDim = kQkNopeDim + 64;  // 256 (q / k per head)

struct MlaPrefillRunArgs {
  const void* q = nullptr;          // [T, heads, 256] BF16: per head q_nope (192) then the rotated q_pe (64)
  const void* kv_b_proj = nullptr;  // [heads * (192 + 256), 512] BF16: kv_b_proj.weight (per head k_nope rows, v rows)
  KvLayerView layer;                // device latent cache: ckv 512 / kpe 64, BF16 or FP8_E4M3
  const int32_t* page_indices = nullptr;  // device: the planned batch's page table
  void* out = nullptr;              // [T, heads, 256] BF16
  float* lse = nullptr;             // optional [T, heads], BASE-2 log-sum-exp of the scaled scores
};

class MlaPrefillExpandedSm90 {
 public:
  // max_kv_tokens: the most context tokens (all requests of a plan together) it will expand;
  // the expansion buffer holds max_kv_tokens x heads x 512 BF16 (64 KB per token at 64 heads).
  MlaPrefillExpandedSm90(int num_heads, float sm_scale, int64_t max_kv_tokens);
  ~MlaPrefillExpandedSm90();
  MlaPrefillExpandedSm90(const MlaPrefillExpandedSm90&) = delete;
  MlaPrefillExpandedSm90& operator=(const MlaPrefillExpandedSm90&) = delete;

  // `batch` in HOST memory (validated as MlaSm90::plan does).
  void plan(const KvBatchView& batch, int64_t page_size, int64_t num_pages, cudaStream_t stream);
  void run(const MlaPrefillRunArgs& a, cudaStream_t stream) const;

  int64_t planned_kv_tokens() const { return kv_tokens_; }
  static constexpr size_t kIntWorkspaceBytes = size_t(8) << 20;

 private:
  int num_heads_;
  float sm_scale_;
  int64_t max_kv_;
  void* ckv_ = nullptr;      // [max_kv, 512] BF16: the gathered latents
  void* kv_ = nullptr;       // [max_kv, heads, 512] BF16: per head [k_nope 192 | kpe 64 | v 256]
  void* kv_indptr_ = nullptr;  // device [R + 1]: context tokens of each request (CSR)
  void* int_ws_ = nullptr;
  void* pinned_ = nullptr;
  void* cublas_ = nullptr;   // cublasHandle_t
  cudaEvent_t copied_ = nullptr;
  std::vector<int64_t> plan_info_;
  int64_t q_tokens_ = 0, kv_tokens_ = 0, requests_ = 0, page_size_ = 0;
  bool planned_ = false;
};

// Internal (mla_expand.cu): gathers the context latents of a planned batch into ckv_out
// [N, 512] BF16 and writes each token's kpe into kv [N, heads, 512] at columns 192..255 of every
// head (both dequantized from FP8 when the cache is FP8).
void mla_gather_latents(const KvLayerView& layer, const int32_t* page_indptr, const int32_t* page_indices,
                        const int32_t* kv_indptr, int64_t requests, int64_t kv_tokens, int num_heads,
                        void* ckv_out, void* kv, cudaStream_t stream);

}  // namespace fp4moe::cuda::attention
