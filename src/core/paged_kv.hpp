// The paged KV cache of MLA + DSA models (GLM-5, DeepSeek-V3/V3.2): its layout and the
// batch description every attention op takes. One definition for the CPU backend
// (cpu/attention/), the CUDA backend (cuda/attention/, cuda/indexer/) and the engine.
//
// ---- Layout ---------------------------------------------------------------------------
// The cache is a pool of `num_pages` pages of `page_size` token slots. A page id names the
// same token slots in every layer: a request's page table is shared by all layers.
// Per layer there are up to three separate arrays (FlashInfer's MLA kernel takes ckv and
// kpe as two arrays, so they are not interleaved), each row-major and contiguous:
//
//   ckv      [num_pages, page_size, ckv_dim]    the kv_a_layernorm'd latent (kv_lora_rank, 512)
//   kpe      [num_pages, page_size, kpe_dim]    the rope key AFTER RoPE (qk_rope_head_dim, 64)
//   index_k  [num_pages, page_size, index_dim]  the indexer key after k_norm and RoPE
//                                               (index_head_dim, 128); only in layers that run
//                                               the indexer ("full" in indexer_types), else absent
//
// The global slot of (page p, offset o) is p * page_size + o; its row in an array is that
// slot (row = slot * dim elements from the array's base).
//
// Element types (KvElem): F32 (exact; CPU reference and tests only), BF16 (round to nearest
// even), FP8 E4M3 "fn" with a per-array scale: stored code = e4m3(x / scale) rounded to
// nearest even and saturated to ±448, value = decode(code) * scale. The scale is fixed when
// the pool is made (one float per array per layer, in KvLayerView).
//
// ---- Batch ----------------------------------------------------------------------------
// One step computes a flat list of T tokens from R requests (prefill chunks and decode
// tokens mixed). KvBatchView describes it with CSR arrays in FlashInfer's style:
//
//   qo_indptr    [R + 1]  request r owns flat tokens [qo_indptr[r], qo_indptr[r+1]);
//                         qo_indptr[0] = 0, non-decreasing, qo_indptr[R] = T
//   positions    [T]      position of token t in its request's sequence (0-based); the tokens
//                         of one request are distinct positions (normally consecutive)
//   kv_len       [R]      tokens of request r in the cache once this step's tokens are
//                         appended; every position of r's tokens is < kv_len[r]
//   page_indptr  [R + 1]  request r's page table is page_indices[page_indptr[r] ..
//   page_indices [..]     page_indptr[r+1]); it holds at least ceil(kv_len[r] / page_size)
//                         pages, each in [0, num_pages)
//
// Position pos of request r lives in slot kv_slot(batch, page_size, r, pos) =
//   page_indices[page_indptr[r] + pos / page_size] * page_size + pos % page_size.
// Causality: the query at position p attends to the keys at positions [0, p] of its own
// request (keys at positions > p may exist in the cache: a prefill chunk appends all its
// tokens before attention runs).
//
// All pointers may be host or device memory; the op that takes a view says which.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/host_device.hpp"

// kv_slot / kv_elem_size are usable in CUDA kernels too.

namespace fp4moe {

enum class KvElem : uint8_t { F32, BF16, FP8_E4M3 };

FP4MOE_HOST_DEVICE constexpr size_t kv_elem_size(KvElem e) { return e == KvElem::F32 ? 4 : e == KvElem::BF16 ? 2 : 1; }
std::string_view kv_elem_name(KvElem e);  // "f32" | "bf16" | "fp8_e4m3"

// The geometry of a whole cache (all layers).
struct PagedKvGeometry {
  int64_t num_layers = 0;
  int64_t page_size = 0;  // tokens per page, >= 1
  int64_t num_pages = 0;  // pages in the pool
  int64_t ckv_dim = 0;    // kv_lora_rank
  int64_t kpe_dim = 0;    // qk_rope_head_dim
  int64_t index_dim = 0;  // index_head_dim (0: no layer has an indexer)
  KvElem elem = KvElem::BF16;        // element type of ckv and kpe
  KvElem index_elem = KvElem::BF16;  // element type of index_k

  // Bytes of one layer's arrays (index_k counted only when has_index).
  size_t ckv_bytes() const { return size_t(num_pages * page_size * ckv_dim) * kv_elem_size(elem); }
  size_t kpe_bytes() const { return size_t(num_pages * page_size * kpe_dim) * kv_elem_size(elem); }
  size_t index_bytes() const { return size_t(num_pages * page_size * index_dim) * kv_elem_size(index_elem); }
};

// One layer's arrays: raw pointers (host or device) + what is needed to address them.
struct KvLayerView {
  void* ckv = nullptr;      // [num_pages, page_size, ckv_dim] of elem
  void* kpe = nullptr;      // [num_pages, page_size, kpe_dim] of elem
  void* index_k = nullptr;  // [num_pages, page_size, index_dim] of index_elem; nullptr: no indexer here
  int64_t num_pages = 0, page_size = 0, ckv_dim = 0, kpe_dim = 0, index_dim = 0;
  KvElem elem = KvElem::BF16, index_elem = KvElem::BF16;
  float ckv_scale = 1.0f, kpe_scale = 1.0f, index_scale = 1.0f;  // FP8 only: value = e4m3 * scale
};

// One step's batch (see the top of this file). Pointers to int32 arrays, host or device.
struct KvBatchView {
  int64_t num_requests = 0;  // R
  int64_t num_tokens = 0;    // T
  const int32_t* qo_indptr = nullptr;     // [R + 1]
  const int32_t* positions = nullptr;     // [T]
  const int32_t* kv_len = nullptr;        // [R]
  const int32_t* page_indptr = nullptr;   // [R + 1]
  const int32_t* page_indices = nullptr;  // [page_indptr[R]]
};

FP4MOE_HOST_DEVICE inline int64_t kv_slot(const KvBatchView& b, int64_t page_size, int64_t request, int64_t pos) {
  return int64_t(b.page_indices[b.page_indptr[request] + pos / page_size]) * page_size + pos % page_size;
}

// Global slots of n positions of one request (host): out[i] = kv_slot(b, page_size, request,
// positions[i]), and -1 where positions[i] is -1 (top-k padding). For attention kernels that
// take a top-k selection as a page table of page_size 1 (FlashInfer's MLA with DSA).
void kv_slots_of_positions(const KvBatchView& b, int64_t page_size, int64_t request, const int32_t* positions,
                           int64_t n, int32_t* out);

// Host-side check of every invariant above against a layer's pool (host pointers only);
// throws fp4moe::Error naming the first violation.
void validate_kv_batch(const KvBatchView& b, int64_t page_size, int64_t num_pages);

// Request of each flat token: out[t] = r with qo_indptr[r] <= t < qo_indptr[r+1] (host).
void kv_token_requests(const KvBatchView& b, int32_t* out);

}  // namespace fp4moe
