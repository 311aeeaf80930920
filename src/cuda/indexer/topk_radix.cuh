// The radix top-k's kernels (launched by indexer_topk_radix.cu; run on the CPU by
// tests/cuda/topk_radix_emu_test.cpp). Scores map to an order-preserving uint32 key (equal
// floats -> equal keys, NaN -> 0); a row's selection is then
//     keys above T, and of the keys equal to T the lowest positions (up to k in all),
// written as ascending positions (and cache slots), -1 padded when the row has <= k keys.
//
// Two launches:
//   select_or_sample  one CTA per row. A row of <= p.row_keys keys (kRowKeys, or kRowKeysLarge where a
//           block may have ~145 KB of shared memory) is loaded into shared memory
//           once, T found by <= 3 histogram passes (12 + 11 + 9 bits, stopping when the bin of
//           the k-th key is taken whole; the second and third read only the first pass's bin,
//           compacted, unless it holds more than kListCap keys) and the selection written in one
//           ordered pass: done.
//           A longer row: the CTA reads a sample (one line of 32 keys out of every `stride`,
//           <= kSampleLines lines) and sets the row's candidate threshold t0 to the sample's
//           r-th largest key, r = the sample's expected share of the top k plus four standard
//           deviations plus 16 (~1.2-1.5 k keys of the row lie above it on unstructured data).
//   gather  G CTAs per long row (gather_ctas_per_row: about one wave over the batch), CTA x
//           taking slices x, x + G, ... of p.slice_keys keys: the keys >= t0 are staged in shared
//           memory and appended to the row's candidate list (one global atomic per CTA). The
//           row's last CTA (arrival counter, no grid sync) resolves T and the position cut among
//           equal keys on the candidates in shared memory, marks the selection in a bitmap of the
//           row (in shared memory over the spent candidate arrays for rows <= 512K keys, else in
//           the workspace) and writes its set bits in order. When the sample missed (fewer than k
//           candidates, or more than kCandCap: heavy ties, scores shaped against the sample) that
//           CTA selects by streaming the whole row instead: correct, slower.
// Each score of a long row is read once (plus the 1/stride sample), with a compare and a warp
// vote per key: no per-key histogram over the whole row.
// The workspace is zeroed once by the caller, and each call leaves all of it zero (row states,
// candidates, bitmaps): its layout depends on the call's row count and max_ctx, so one call's
// candidate area is the next call's row states or bitmaps when those differ.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/kv_device.cuh"
#include "cuda/indexer/topk_sample.hpp"
#include "cuda/indexer/topk_smem.hpp"

namespace fp4moe::cuda::indexer::topk {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kSliceKeys = 4096;                        // longer rows: keys per gather CTA (default, and the unit)
constexpr int kMaxSliceKeys = 16 * kSliceKeys;          // 64K keys per CTA: 64 per thread
constexpr int kMaxK = 4096;                             // the selection is staged in the kBins0 histogram ints
static_assert(kMaxK <= kBins0 && kMaxK % kThreads == 0, "");
constexpr int kCandCap = 8192;                          // candidates resolved in shared memory
constexpr int kSharedBitmapKeys = 2 * kCandCap * 32;    // rows up to 512K keys: the selection bitmap over the candidates' arrays
constexpr int kPosBits = 22;                            // positions < 2^22 (the tie cut's radix)
constexpr uint32_t kPosMax = (1u << kPosBits) - 1;
constexpr int kNoCut = 0x7fffffff;

// Per row, in the workspace; zero between calls.
struct RowState {
  uint32_t arrive;  // gather CTAs of the row done
  uint32_t cand_n;  // candidates appended (may exceed kCandCap: then the row is streamed)
  uint32_t t0;      // candidate threshold (an order key), from the sample
  uint32_t pad[13];
};
static_assert(sizeof(RowState) == 64, "");
static_assert(kSliceKeys % (4 * kThreads) == 0, "gather: slices of whole 4-step batches");

struct Params {
  const float* scores;
  int64_t score_stride;
  const int32_t* qo_indptr;
  const int32_t* positions;
  const int32_t* page_indptr;
  const int32_t* page_indices;
  int num_requests;
  int top_k;
  int32_t* out_pos;
  int32_t* out_slot;
  int page_shift;
  int max_ctx;
  int row_keys = kRowKeys;      // rows of <= row_keys keys take one CTA (kRowKeys or kRowKeysLarge); longer ones:
  int slice_keys = kSliceKeys;  // keys per gather CTA (a multiple of kSliceKeys)
  int sample_lines = kSampleLines;  // the most lines of 32 keys sampled (32..kSampleLines)
  // Workspace (rows longer than row_keys): per row a RowState, kCandCap candidates
  // (key, position) and bitmap_words words of selection bits.
  RowState* state;
  uint2* cand;
  uint32_t* bitmap;
  int64_t bitmap_words;
  int32_t* cand_counts = nullptr;  // optional, per row: a long row's candidate count (diagnostics)
};

// Host: the workspace's layout for `rows` rows of up to max_ctx keys (all zero sizes when
// max_ctx <= row_keys: one launch, no workspace), and each kernel's dynamic shared memory.
struct Layout {
  int64_t slices = 0, bitmap_words = 0;
  size_t state = 0, cand = 0, bitmap = 0, total = 0;  // byte offsets, size
};
inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }
inline Layout workspace_layout(int64_t rows, int max_ctx, int slice_keys = kSliceKeys, int row_keys = kRowKeys) {
  Layout l;
  if (max_ctx <= row_keys) return l;
  l.slices = (max_ctx + slice_keys - 1) / slice_keys;
  l.bitmap_words = max_ctx > kSharedBitmapKeys ? (int64_t(max_ctx) + 31) / 32 : 0;  // else in shared memory
  const size_t r = size_t(rows);
  l.cand = align256(r * sizeof(RowState));
  l.bitmap = l.cand + align256(r * kCandCap * 2 * sizeof(uint32_t));
  l.total = l.bitmap + align256(r * size_t(l.bitmap_words) * sizeof(uint32_t));
  return l;
}
// Wider slices for many long rows: the smallest multiple of kSliceKeys that keeps rows x slices
// within `ctas` CTAs (two per SM is the occupancy at 1024 threads), at most kMaxSliceKeys. Each
// gather CTA pays a fixed cost (its launch, staging, one global atomic, an arrival fence), which
// 4K-key slices pay 8,192 times per launch at B 256 / 128K.
inline int slice_keys_for(int64_t rows, int max_ctx, int ctas) {
  int slice = kSliceKeys;
  const int64_t r = rows > 0 ? rows : 1, c = ctas > 0 ? ctas : 1;
  while (slice < kMaxSliceKeys && r * ((max_ctx + slice - 1) / slice) > c) slice += kSliceKeys;
  return slice;
}
// The gather launch's CTAs per row: as many as keep rows x CTAs within `resident` CTAs (at least
// one per row, at most one per slice of a max_ctx row). CTA x of a row takes slices x, x + G, ...
// of it: a row shorter than max_ctx (a decode graph captured at the largest context) uses fewer
// CTAs, and no launch holds more than ~one wave of them, each of which would pay the CTA's fixed
// costs (staging, a global atomic, the arrival).
inline int gather_ctas_per_row(int64_t rows, int64_t slices, int resident) {
  const int64_t g = resident / (rows > 0 ? rows : 1);
  return int(g < 1 ? 1 : g < slices ? g : slices);
}
inline bool sample_lines_valid(int lines) { return lines >= 32 && lines <= kSampleLines; }
inline bool slice_keys_valid(int slice_keys) {
  return slice_keys >= kSliceKeys && slice_keys <= kMaxSliceKeys && slice_keys % kSliceKeys == 0;
}
inline size_t gather_smem_bytes() { return (kBins0 + kScratchInts) * sizeof(int) + kCandCap * 2 * sizeof(uint32_t); }
// Points p's workspace arrays into ws (layout l).
inline void bind_workspace(Params& p, void* ws, const Layout& l) {
  auto* b = static_cast<unsigned char*>(ws);
  p.state = reinterpret_cast<RowState*>(b + l.state);
  p.cand = reinterpret_cast<uint2*>(b + l.cand);
  p.bitmap = reinterpret_cast<uint32_t*>(b + l.bitmap);
  p.bitmap_words = l.bitmap_words;
}

// The sample rank whose key is the candidate threshold: the sample holds ~k / stride of the
// row's top k; four standard deviations (binomial, ~sqrt of that) and 16 on top.
__host__ __device__ inline int sample_rank(int k, int stride) {
  const float m = float(k) / float(stride);
  return int(m + 4.0f * sqrtf(m)) + 16;
}

// Kernels and helpers: internal linkage (the emulator tests compile this header too, and a
// kernel's host stub must not meet its CPU twin at link time).
namespace {

// Larger float -> larger key; -0 and +0 one key (they compare equal: a tie); NaN -> 0.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;
  if ((u & 0x7fffffffu) == 0u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ int row_ctx(const Params& p, int row) {
  const int c = p.positions[row] + 1;
  return c < p.max_ctx ? c : p.max_ctx;  // positions beyond max_ctx are outside the contract
}

// The offset of the row's page table in page_indices (0 without out_slot). Kernels load it first: a chain of dependent
// cold loads (request search, page_indptr) that then overlaps the row's work.
__device__ __forceinline__ int row_pages(const Params& p, int row) {
  return p.out_slot ? p.page_indptr[attention::request_of(p.qo_indptr, p.num_requests, row)] : 0;
}

// The row's selection written out: entry n (< top_k) is position pos_at(n) (-1: padding) and,
// with out_slot, its cache slot (the row's page table: page_indices + pages, from row_pages).
// Entry n is thread n % kThreads's: coalesced stores, and a thread's page-table loads
// (<= kMaxK / kThreads) are issued together, not one per ballot step.
template <typename PosAt>
__device__ __forceinline__ void write_selection(const Params& p, int row, int pages, PosAt pos_at) {
  constexpr int kPer = kMaxK / kThreads;
  const int tid = int(threadIdx.x);
  int32_t pos[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int n = tid + q * kThreads;
    pos[q] = n < p.top_k ? pos_at(n) : -1;
  }
  const int64_t first = int64_t(row) * p.top_k;
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (tid + q * kThreads < p.top_k) p.out_pos[first + tid + q * kThreads] = pos[q];
  if (!p.out_slot) return;
  int32_t slot[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) slot[q] = pos[q] < 0 ? -1 : int32_t(attention::slot_of(p.page_indices + pages, p.page_shift, pos[q]));
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (tid + q * kThreads < p.top_k) p.out_slot[first + tid + q * kThreads] = slot[q];
}

// The keys still in play, (key & mask) == prefix, of which `need` are wanted (the largest).
struct Sel {
  uint32_t prefix, mask;
  int need;
};

// After a histogram of kBins bins in shared memory: the bin holding the need-th largest key.
// Sets sel (prefix / mask gain the bin's digit at `shift`, need drops by the keys above it)
// and returns the bin's key count (== sel.need: the bin is taken whole). Every thread calls;
// uniform result.
template <int kBins>
__device__ __forceinline__ int take_bin(const int* hist, int shift, Sel& sel, int* scratch) {
  constexpr int kPer = kBins >= kThreads ? kBins / kThreads : 1;
  const int tid = int(threadIdx.x);
  const int hi = kBins - 1 - tid * kPer;  // this thread's bins: hi, hi - 1, ... (from the top)
  int c[kPer];
  int sum = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    c[q] = hi - q >= 0 ? hist[hi - q] : 0;
    sum += c[q];
  }
  if (tid == 0) scratch[40] = 0, scratch[41] = 0, scratch[42] = 0;
  int total = 0;
  int above = prims::block_exclusive_sum<kThreads>(sum, total, scratch);  // keys in bins above hi
  if (above < sel.need && above + sum >= sel.need) {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      if (above + c[q] >= sel.need) {
        scratch[40] = hi - q;
        scratch[41] = above;
        scratch[42] = c[q];
        break;
      }
      above += c[q];
    }
  }
  __syncthreads();
  const int bin = scratch[40], bin_above = scratch[41], bin_count = scratch[42];
  __syncthreads();
  sel.prefix |= uint32_t(bin) << shift;
  sel.mask |= uint32_t(kBins - 1) << shift;
  sel.need -= bin_above;
  return bin_count;
}

// One histogram pass over n items: get(i, key) -> false to skip item i; counts the keys in
// play by their digit (key >> shift) & (kBins - 1), then take_bin (the chosen bin's count).
// hist: kBins shared ints.
template <int kBins, typename Get>
__device__ __forceinline__ int radix_pass(Get get, int n, int shift, Sel& sel, int* hist, int* scratch) {
  const int tid = int(threadIdx.x);
  for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  for (int base = 0; base < n; base += kThreads) {
    const int i = base + tid;
    int digit = -1;
    uint32_t key = 0;
    if (i < n && get(i, key) && (key & sel.mask) == sel.prefix) digit = int((key >> shift) & uint32_t(kBins - 1));
    // A plain shared atomic per key, its result unused (a fire-and-forget reduction): the steps
    // pipeline. Aggregating equal digits with __match_any_sync first put the match's latency
    // (~200 cycles, ncu) on every step: 30 % of a one-CTA row's time at 8K keys.
    if (digit >= 0) atomicAdd(&hist[digit], 1);
  }
  __syncthreads();
  return take_bin<kBins>(hist, shift, sel, scratch);
}

// The items of the bin the first pass chose, compacted: their indices go to hist[kListAt ..]
// (the later passes' histograms take <= 2048 bins below it). A bin of more than kListCap items
// (heavy ties) is not compacted: the later passes read all n items instead.
constexpr int kListAt = 2048, kListCap = kBins0 - kListAt;

// The need-th largest key T of n items (get(i, key) -> false skips item i): sel narrowed in up to
// three passes (12 + 11 + 9 bits), stopping when a bin is taken whole. The first pass reads all
// n items; when its bin is not taken whole and holds <= kListCap items they are compacted (a
// compare and a warp vote per item) and the second and third passes read only those. Returns
// whether a bin was taken whole, and the compacted count (-1: not compacted). hist: kBins0 ints.
struct Narrowed {
  bool whole;
  int list_n;
};
template <typename Get>
__device__ __forceinline__ Narrowed narrow(Get get, int n, Sel& sel, int* hist, int* scratch) {
  const int c = radix_pass<kBins0>(get, n, 20, sel, hist, scratch);
  if (c == sel.need) return {true, -1};
  if (c > kListCap) {
    if (radix_pass<2048>(get, n, 9, sel, hist, scratch) == sel.need) return {true, -1};
    return {radix_pass<512>(get, n, 0, sel, hist, scratch) == sel.need, -1};
  }
  int* list = hist + kListAt;
  if (threadIdx.x == 0) scratch[45] = 0;
  __syncthreads();
  for (int base = 0; base < n; base += kThreads) {  // uniform trip count: the warp vote below
    const int i = base + int(threadIdx.x);
    uint32_t key = 0;
    const bool in = i < n && get(i, key) && (key & sel.mask) == sel.prefix;
    const int at = prims::warp_append(in, &scratch[45]);
    if (at >= 0 && at < kListCap) list[at] = i;
  }
  __syncthreads();  // c items listed (the count the histogram gave)
  auto listed = [&](int j, uint32_t& key) { return get(list[j], key); };
  if (radix_pass<2048>(listed, c, 9, sel, hist, scratch) == sel.need) return {true, c};
  return {radix_pass<512>(listed, c, 0, sel, hist, scratch) == sel.need, c};
}

// A row of ctx (> k) keys, key_at(i) its i-th order key: T by up to three passes, then the
// ordered selection (ties at T: the lowest positions, by the order of the pass), staged in hist
// and written out. hist: kBins0 shared ints. key_at reads shared memory (one-CTA rows) or the
// scores (a streamed long row).
template <typename KeyAt>
__device__ __forceinline__ void select_row(const Params& p, int row, int pages, int ctx, KeyAt key_at,
                                           int* hist, int* scratch) {
  const int lane = prims::lane_id(), warp = prims::warp_id();
  Sel sel{0u, 0u, p.top_k};
  auto get = [&](int i, uint32_t& key) {
    key = key_at(i);
    return true;
  };
  narrow(get, ctx, sel, hist, scratch);

  // Ordered: warp w owns keys [w * chunk, (w + 1) * chunk), 32 consecutive keys per step.
  const int chunk = ((ctx + kThreads - 1) / kThreads) * 32;
  const int w0 = warp * chunk;
  int gt_w = 0, eq_w = 0;
  for (int j = 0; j < chunk; j += 32) {
    const int i = w0 + j + lane;
    const uint32_t km = i < ctx ? key_at(i) & sel.mask : 0u;
    gt_w += __popc(__ballot_sync(prims::kFullMask, i < ctx && km > sel.prefix));
    eq_w += __popc(__ballot_sync(prims::kFullMask, i < ctx && km == sel.prefix));
  }
  int total = 0;
  int eq_base = prims::block_exclusive_sum<kThreads>(lane == 0 ? eq_w : 0, total, scratch);
  eq_base = __shfl_sync(prims::kFullMask, eq_base, 0);
  const int eq_take = eq_base >= sel.need ? 0 : (eq_w < sel.need - eq_base ? eq_w : sel.need - eq_base);
  int out = prims::block_exclusive_sum<kThreads>(lane == 0 ? gt_w + eq_take : 0, total, scratch);
  out = __shfl_sync(prims::kFullMask, out, 0);
  int eq_seen = eq_base;
  for (int j = 0; j < chunk; j += 32) {
    const int i = w0 + j + lane;
    const uint32_t km = i < ctx ? key_at(i) & sel.mask : 0u;
    const bool eq = i < ctx && km == sel.prefix;
    const unsigned eqb = __ballot_sync(prims::kFullMask, eq);
    const bool take = (i < ctx && km > sel.prefix) || (eq && eq_seen + __popc(eqb & prims::lanemask_lt()) < sel.need);
    const unsigned tb = __ballot_sync(prims::kFullMask, take);
    const int n = out + __popc(tb & prims::lanemask_lt());
    if (take && n < p.top_k) hist[n] = i;  // the histogram is spent: it stages the selection
    out += __popc(tb);
    eq_seen += __popc(eqb);
  }
  __syncthreads();
  write_selection(p, row, pages, [&](int n) { return hist[n]; });  // exactly k taken (ctx > k)
}

// Arrival of this CTA at a per-row counter; true in the row's last CTA (which then sees every
// other CTA's global writes and resets the counter). Every thread calls.
__device__ __forceinline__ bool last_to_arrive(uint32_t* counter, uint32_t expected, int* scratch) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t prev = atomicAdd(counter, 1u);
    scratch[44] = prev + 1 == expected;
    if (prev + 1 == expected) *counter = 0u;
  }
  __syncthreads();
  const bool last = scratch[44] != 0;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Dynamic shared memory: [hist kBins0 ints][scratch kScratchInts ints][row keys or the sample].
// Grid (1, rows).
__global__ void __launch_bounds__(kThreads) topk_select_or_sample_kernel(const Params p) {
  FP4MOE_DYNAMIC_SMEM(int, hist);
  int* scratch = hist + kBins0;
  uint32_t* keys = reinterpret_cast<uint32_t*>(scratch + kScratchInts);
  prims::pdl_wait();  // launched with PDL: the scores come from the kernel before
  prims::pdl_release();
  const int row = int(blockIdx.y), tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int ctx = row_ctx(p, row);
  const float* s = p.scores + int64_t(row) * p.score_stride;
  if (ctx <= p.row_keys) {
    const int pages = row_pages(p, row);
    if (ctx <= p.top_k) {  // dense: every position, then -1 padding
      write_selection(p, row, pages, [&](int n) { return n < ctx ? n : -1; });
      return;
    }
    constexpr int kPer = kRowKeys / kThreads;  // 16K keys' loads in flight, then their stores
    for (int base = tid; base < ctx; base += kPer * kThreads) {
      float v[kPer];
#pragma unroll
      for (int q = 0; q < kPer; ++q) v[q] = base + q * kThreads < ctx ? s[base + q * kThreads] : 0.0f;
#pragma unroll
      for (int q = 0; q < kPer; ++q)
        if (base + q * kThreads < ctx) keys[base + q * kThreads] = order_key(v[q]);
    }
    __syncthreads();
    select_row(p, row, pages, ctx, [&](int i) { return keys[i]; }, hist, scratch);
    return;
  }
  // A long row: its sample (warp w: lines w, w + 32, ...; loads first, all in flight), then t0.
  constexpr int kPer = kSampleLines / kWarps;
  const int stride = sample_stride(ctx, p.sample_lines), groups = ((ctx + 31) / 32 + stride - 1) / stride;
  uint32_t v[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int g = warp + q * kWarps, i = sample_line(g, stride) * 32 + lane;
    v[q] = g < groups && i < ctx ? order_key(s[i]) : 0u;  // past the row: key 0, the lowest
  }
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (warp + q * kWarps < groups) keys[(warp + q * kWarps) * 32 + lane] = v[q];
  __syncthreads();
  const int n = groups * 32, r = sample_rank(p.top_k, stride);
  Sel sel{0u, 0u, r < n ? r : n};
  auto get = [&](int i, uint32_t& key) {
    key = keys[i];
    return true;
  };
  narrow(get, n, sel, hist, scratch);
  if (tid == 0) p.state[row].t0 = sel.prefix;  // the bin's lowest key when a bin was taken whole
}

// The selection rule resolved on n candidates (key, position) in shared memory, need of them
// wanted: (key & mask) > t, or == t and position <= p_cut. hist: kBins0 shared ints.
struct Rule {
  uint32_t mask, t;
  int p_cut;
};
__device__ __forceinline__ Rule resolve_candidates(const uint32_t* ckey, const int32_t* cpos, int n, int need,
                                                   int* hist, int* scratch) {
  Sel sel{0u, 0u, need};
  auto get = [&](int i, uint32_t& key) {
    key = ckey[i];
    return true;
  };
  const Narrowed nr = narrow(get, n, sel, hist, scratch);
  int p_cut = kNoCut;
  if (!nr.whole) {  // sel.need of the keys equal to T (sel.prefix, all 32 bits): the lowest positions
    const uint32_t t = sel.prefix;
    auto pos_key = [&](int i, uint32_t& key) {
      if (ckey[i] != t) return false;
      key = kPosMax - uint32_t(cpos[i]);  // the largest of these = the lowest positions
      return true;
    };
    Sel ps{0u, 0u, sel.need};
    const int* list = hist + kListAt;
    auto listed = [&](int j, uint32_t& key) { return pos_key(nr.list_n >= 0 ? list[j] : j, key); };
    const int items = nr.list_n >= 0 ? nr.list_n : n;  // the keys equal to T are among the listed ones
    radix_pass<2048>(listed, items, 11, ps, hist, scratch);
    radix_pass<2048>(listed, items, 0, ps, hist, scratch);
    p_cut = int(kPosMax - ps.prefix);
  }
  return Rule{sel.mask, sel.prefix, p_cut};
}

// The set bits of a row's bitmap (ctx bits) written in order as the row's selection (staged in
// sel, kMaxK shared ints). kGlobal: the bitmap is the row's in the workspace, read past L1 and
// left zero; else it is in shared memory.
template <bool kGlobal>
__device__ __forceinline__ void emit_bitmap(const Params& p, int row, int pages, int ctx, uint32_t* bits,
                                            int32_t* sel, int* scratch) {
  const int tid = int(threadIdx.x);
  const int words = (ctx + 31) / 32;
  const int per = (words + kThreads - 1) / kThreads;
  const int w0 = tid * per, w1 = w0 + per < words ? w0 + per : words;
  int cnt = 0;
  for (int w = w0; w < w1; ++w) cnt += __popc(kGlobal ? __ldcg(&bits[w]) : bits[w]);
  int total = 0;
  int out = prims::block_exclusive_sum<kThreads>(cnt, total, scratch);
  for (int w = w0; w < w1; ++w) {
    uint32_t b = kGlobal ? __ldcg(&bits[w]) : bits[w];
    if (kGlobal) bits[w] = 0u;
    while (b != 0u) {
      const int bit = __ffs(int(b)) - 1;
      if (out < p.top_k) sel[out] = w * 32 + bit;
      ++out;
      b &= b - 1u;
    }
  }
  __syncthreads();
  write_selection(p, row, pages, [&](int n) { return n < total ? sel[n] : -1; });  // (total == k: ctx > k)
}

// Dynamic shared memory: [hist kBins0 ints][scratch kScratchInts ints][keys kCandCap][pos kCandCap].
// Grid (G, rows), G = gather_ctas_per_row: CTA x of a row takes its slices x, x + G, ...
__global__ void __launch_bounds__(kThreads) topk_gather_kernel(const Params p) {
  FP4MOE_DYNAMIC_SMEM(int, hist);
  int* scratch = hist + kBins0;
  uint32_t* ckey = reinterpret_cast<uint32_t*>(scratch + kScratchInts);
  int32_t* cpos = reinterpret_cast<int32_t*>(ckey + kCandCap);
  prims::pdl_wait();  // launched with PDL: t0 comes from the sample kernel before
  prims::pdl_release();
  const int row = int(blockIdx.y), tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int ctx = row_ctx(p, row);
  if (ctx <= p.row_keys) return;
  const int slices = (ctx + p.slice_keys - 1) / p.slice_keys;
  const int ctas = slices < int(gridDim.x) ? slices : int(gridDim.x);  // this row's CTAs
  if (int(blockIdx.x) >= ctas) return;
  RowState& st = p.state[row];
  const uint32_t t0 = st.t0;
  const float* s = p.scores + int64_t(row) * p.score_stride;
  uint2* cand = p.cand + int64_t(row) * kCandCap;
  if (tid == 0) scratch[46] = 0;
  __syncthreads();
  // This CTA's slices' keys >= t0, staged in shared memory (a shared counter per warp step).
  // Warp w owns slice_keys / 32 consecutive keys of a slice, 32 per step; four steps' loads are
  // issued together.
  const int steps = p.slice_keys / kThreads;  // a multiple of 4
  for (int sl = int(blockIdx.x); sl < slices; sl += int(gridDim.x)) {
    const int base = sl * p.slice_keys + warp * (p.slice_keys / kWarps);
    for (int j0 = 0; j0 < steps; j0 += 4) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + (j0 + u) * 32 + lane;
        v[u] = i < ctx ? s[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + (j0 + u) * 32 + lane;
        const uint32_t key = order_key(v[u]);
        const int at = prims::warp_append(i < ctx && key >= t0, &scratch[46]);  // no atomic where no lane is in
        if (at >= 0 && at < kCandCap) {
          ckey[at] = key;
          cpos[at] = i;
        }
      }
    }
  }
  __syncthreads();
  const int n_local = scratch[46];
  if (n_local > 0) {  // one global atomic per CTA, then the staged candidates copied out
    if (tid == 0) scratch[47] = int(atomicAdd(&st.cand_n, uint32_t(n_local)));
    __syncthreads();
    const int at0 = scratch[47], m = n_local < kCandCap ? n_local : kCandCap;
    for (int j = tid; j < m && at0 + j < kCandCap; j += kThreads) cand[at0 + j] = uint2{ckey[j], uint32_t(cpos[j])};
  }
  if (!last_to_arrive(&st.arrive, uint32_t(ctas), scratch)) return;
  const int pages = row_pages(p, row);  // its loads overlap the candidates' below
  const uint32_t n_all = __ldcg(&st.cand_n);
  __syncthreads();
  if (tid == 0) {  // every CTA of the row has read t0 (before it arrived)
    st.cand_n = 0u;
    st.t0 = 0u;
    if (p.cand_counts) p.cand_counts[row] = int32_t(n_all);
  }
  if (n_all < uint32_t(p.top_k) || n_all > uint32_t(kCandCap)) {  // the sample missed: stream the row
    const int written = n_all < uint32_t(kCandCap) ? int(n_all) : kCandCap;
    for (int i = tid; i < written; i += kThreads) cand[i] = uint2{0u, 0u};
    select_row(p, row, pages, ctx, [&](int i) { return order_key(s[i]); }, hist, scratch);
    return;
  }
  const int n = int(n_all);
  for (int i0 = 0; i0 < n; i0 += 4 * kThreads) {  // four loads in flight per thread, then the stores
    uint2 c[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + tid + q * kThreads;
      c[q] = i < n ? __ldcg(&cand[i]) : uint2{0u, 0u};
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + tid + q * kThreads;
      if (i < n) {
        ckey[i] = c[q].x;
        cpos[i] = int32_t(c[q].y);
        cand[i] = uint2{0u, 0u};  // left zero (the header's first comment)
      }
    }
  }
  __syncthreads();
  const Rule rule = resolve_candidates(ckey, cpos, n, p.top_k, hist, scratch);
  auto taken = [&](int i) {
    const uint32_t km = ckey[i] & rule.mask;
    return km > rule.t || (km == rule.t && cpos[i] <= rule.p_cut);
  };
  if (ctx > kSharedBitmapKeys) {  // the row's bitmap in the workspace
    uint32_t* bits = p.bitmap + int64_t(row) * p.bitmap_words;
    for (int i = tid; i < n; i += kThreads)
      if (taken(i)) atomicOr(&bits[cpos[i] >> 5], 1u << (cpos[i] & 31));
    __threadfence_block();
    __syncthreads();
    emit_bitmap<true>(p, row, pages, ctx, bits, hist, scratch);
    return;
  }
  // The bitmap in shared memory, over the candidates' arrays: each thread's selected positions
  // (<= kCandCap / kThreads) to registers first.
  constexpr int kPer = kCandCap / kThreads;
  int32_t mine[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int i = tid + q * kThreads;
    mine[q] = i < n && taken(i) ? cpos[i] : -1;
  }
  __syncthreads();
  uint32_t* bits = ckey;
  for (int w = tid; w < (ctx + 31) / 32; w += kThreads) bits[w] = 0u;
  __syncthreads();
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (mine[q] >= 0) atomicOr(&bits[mine[q] >> 5], 1u << (mine[q] & 31));
  __syncthreads();
  emit_bitmap<false>(p, row, pages, ctx, bits, hist, scratch);
}

}  // namespace

}  // namespace fp4moe::cuda::indexer::topk
