// A decode schedule for FlashInfer's SM90 MLA kernel (BatchMLAPageAttentionHopper) built on the
// DEVICE from the rows' lengths in device memory, so a CUDA graph can capture the decode:
// MlaSm90::run_device. FlashInfer's own MLAPlan is host work over host lengths (MlaSm90::plan).
//
// What the kernel reads (FlashInfer 0.7.2.post1, mla_hopper.cuh, as vendored): the CTA on grid
// row c runs work items [work_indptr[c], work_indptr[c + 1]); each item names its request
// (q_indptr: the query token), the request's page-table start (kv_indptr, in pages), its FULL
// key count (kv_len: the causal reference), and a key range [kv_start, kv_end) in tokens; it
// writes the final output (partial_indptr == -1) or its partial O / LSE rows at partial_indptr.
// After a grid-wide barrier, merge slot c (one per CTA) merges the final rows
// [merge_start, merge_end) from the partial rows start_p + i + k * stride while < end_p.
//
// Our schedule, for rows x splits items (64 heads: one 64-row tile per query token):
//   - item w = s * rows + r (split-major) is split s of row r; items go round-robin over the
//     CTAs (w % ctas), stored CTA by CTA;
//   - split s of a row of L keys covers [s * chunk, min((s + 1) * chunk, L)), chunk =
//     round_up(ceil(L / splits), 64): kv_start stays a multiple of the kernel's 64-key tile
//     (its middle tiles are not masked) and kv_end <= kv_len (its lower tiles are not bounds
//     checked). A split past the end is empty (0 / 0: the kernel writes o = 0, lse = -inf,
//     which the merge drops);
//   - splits > 1: split s of row r writes partial rows s * N + 64 r + h (N = 64 rows); so
//     final row f merges rows f, f + N, ... < splits * N, and merge slot c takes an equal
//     share of the N final rows;
//   - splits == 1: every item writes the output; every merge slot is empty.
// Plain C++ (host and device): the CPU test checks the schedule, the kernel runs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cuda::attention::fi_sched {

inline constexpr int kTileKeys = 64;     // FlashInfer's CTA_TILE_KV
inline constexpr int kRowsPerToken = 64;  // 64 heads: one CTA_TILE_Q tile per query token

// Byte offsets of the arrays in the int workspace (FlashInfer's MLAPlanInfo order), 16-byte
// aligned; the per-item arrays hold max_items, the merge arrays ctas, work_indptr ctas + 1.
struct Layout {
  int64_t q_indptr, kv_indptr, partial_indptr, merge_start, merge_end, merge_p_start, merge_p_end, merge_stride,
      q_len, kv_len, q_start, kv_start, kv_end, work_indptr, bytes;
};

inline Layout layout(int max_items, int ctas) {
  int64_t at = 0;
  auto take = [&at](int64_t n) {
    const int64_t off = at;
    at += (n * 4 + 15) / 16 * 16;
    return off;
  };
  Layout l{};
  l.q_indptr = take(max_items);
  l.kv_indptr = take(max_items);
  l.partial_indptr = take(max_items);
  l.merge_start = take(ctas);
  l.merge_end = take(ctas);
  l.merge_p_start = take(ctas);
  l.merge_p_end = take(ctas);
  l.merge_stride = take(ctas);
  l.q_len = take(max_items);
  l.kv_len = take(max_items);
  l.q_start = take(max_items);
  l.kv_start = take(max_items);
  l.kv_end = take(max_items);
  l.work_indptr = take(int64_t(ctas) + 1);
  l.bytes = at;
  return l;
}

// The split count for rows of at most max_keys keys on ctas CTAs, sized like FlashInfer's MLAPlan:
// the keys per CTA if the rows' keys were spread evenly (rows x max_keys / ctas) rounded up to a
// chunk of 64 / 128 / 192 / a multiple of 256 keys (MLAPlan's kv_len_limit, at least one 64-key
// tile here), as many splits as that chunk takes to cover max_keys, but at most one item per
// CTA (rows x splits <= ctas; so within the partial buffer of 2 x ctas x 64 rows, as MLAPlan's).
// Our items of one row are equal and dealt round-robin, so a few items past the CTA count would
// be a second wave; MLAPlan balances unequal pieces with a heap instead. Measured on the H200
// (bench attention): about two items per CTA ran 1.3-1.9x slower at B 1-16 (each item pays the
// kernel's Q load and prologue, the merge reads every split's partial rows), 9 splits at B 16
// (144 items) 1.47x slower at 128K than 8.
inline int chunk_keys_for(int rows, int max_keys, int ctas) {
  const int64_t r = rows > 0 ? rows : 1, k = max_keys > 0 ? max_keys : 1, c = ctas > 0 ? ctas : 1;
  const int64_t per_cta = (r * k + c - 1) / c;
  int64_t chunk = per_cta <= 16 ? 64 : per_cta <= 32 ? 128 : per_cta <= 64 ? 192 : (per_cta + 255) / 256 * 256;
  if (chunk > k) chunk = (k + kTileKeys - 1) / kTileKeys * kTileKeys;  // one split: the row itself
  return int(chunk);
}
inline int splits_for(int rows, int max_keys, int ctas) {
  const int64_t k = max_keys > 0 ? max_keys : 1;
  const int64_t chunk = chunk_keys_for(rows, max_keys, ctas);
  int64_t s = (k + chunk - 1) / chunk;
  const int64_t one_wave = int64_t(ctas > 0 ? ctas : 1) / (rows > 0 ? rows : 1);
  if (s > one_wave) s = one_wave;
  return s > 1 ? int(s) : 1;
}

struct Params {
  // dense (top_k == 0): row r's keys are positions [0, kv_len[r]) through the page table at
  // kv_indices + page_indptr[r] (pages); sparse: the first min(top_k, positions[r] + 1) slots of
  // kv_indices + r * top_k (page size 1)
  const int32_t* kv_len = nullptr;
  const int32_t* page_indptr = nullptr;
  const int32_t* positions = nullptr;
  int top_k = 0;
  int rows = 0, splits = 1, ctas = 0;
  unsigned char* ws = nullptr;  // the int workspace, laid out by `layout`
  Layout l{};
};

// Threads 0 .. max(rows * splits, ctas + 1) - 1 each write their part.
inline int threads(const Params& p) {
  const int items = p.rows * p.splits;
  return items > p.ctas + 1 ? items : p.ctas + 1;
}

FP4MOE_HD int32_t* at(const Params& p, int64_t off) { return reinterpret_cast<int32_t*>(p.ws + off); }

// CTA c's first item in the CTA-by-CTA order, for n items dealt round-robin over ctas CTAs.
FP4MOE_HD int first_of_cta(int c, int n, int ctas) { return c * (n / ctas) + (c < n % ctas ? c : n % ctas); }

FP4MOE_HD void write(const Params& p, int i) {
  const int n = p.rows * p.splits, N = p.rows * kRowsPerToken;
  if (i <= p.ctas) at(p, p.l.work_indptr)[i] = first_of_cta(i, n, p.ctas);
  if (i < p.ctas) {
    int st = 0, en = 0, pend = 0;
    if (p.splits > 1) {
      const int share = (N + p.ctas - 1) / p.ctas;
      st = i * share < N ? i * share : N;
      en = st + share < N ? st + share : N;
      pend = p.splits * N;
    }
    at(p, p.l.merge_start)[i] = st;
    at(p, p.l.merge_end)[i] = en;
    at(p, p.l.merge_p_start)[i] = st;
    at(p, p.l.merge_p_end)[i] = pend;
    at(p, p.l.merge_stride)[i] = N;
  }
  if (i >= n) return;
  const int s = i / p.rows, r = i % p.rows, c = i % p.ctas;
  const int w = first_of_cta(c, n, p.ctas) + i / p.ctas;
  int32_t len, page0;
  if (p.top_k > 0) {
    const int32_t pos1 = p.positions[r] + 1;
    len = pos1 < p.top_k ? pos1 : p.top_k;
    page0 = r * p.top_k;
  } else {
    len = p.kv_len[r];
    page0 = p.page_indptr[r];
  }
  if (len < 0) len = 0;
  const int per = ((len > 0 ? len : 1) + p.splits - 1) / p.splits;
  const int chunk = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  int ks = s * chunk, ke = ks + chunk < len ? ks + chunk : len;
  if (ks >= ke) ks = ke = 0;
  at(p, p.l.q_indptr)[w] = r;
  at(p, p.l.kv_indptr)[w] = page0;
  at(p, p.l.partial_indptr)[w] = p.splits > 1 ? s * N + r * kRowsPerToken : -1;
  at(p, p.l.q_len)[w] = 1;
  at(p, p.l.kv_len)[w] = len;
  at(p, p.l.q_start)[w] = 0;
  at(p, p.l.kv_start)[w] = ks;
  at(p, p.l.kv_end)[w] = ke;
}

}  // namespace fp4moe::cuda::attention::fi_sched
