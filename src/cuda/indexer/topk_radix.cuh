// The radix top-k's kernels (launched by indexer_topk_radix.cu; run on the CPU by
// tests/cuda/topk_radix_emu_test.cpp). Scores map to an order-preserving uint32 key (equal
// floats -> equal keys, NaN -> 0); a row's selection is then
//     keys above T, and of the keys equal to T the lowest positions (up to k in all),
// written as ascending positions (and cache slots), -1 padded when the row has <= k keys.
//
// Rows of <= kRowKeys keys: one CTA (topk_pass0_kernel, slice 0) loads the row into shared
// memory once, finds T with <= 3 histogram passes (12 + 11 + 9 bits, stopping when the bin
// of the k-th key is taken whole) and writes the selection in one ordered pass.
// Longer rows: one CTA per slice of p.slice_keys keys (kSliceKeys = 4K by default; a multiple of
// it up to kMaxSliceKeys) in three kernels, each CTA counting its
// arrival per row so that the row's last CTA finishes the row's step (no grid sync):
//   pass0   12-bit histogram of the slice into the row's global histogram; the last CTA
//           finds the bin of the k-th key (and resets the histogram);
//   collect the keys of that bin (in practice a few thousand) are appended to the row's
//           candidate list; the last CTA resolves T and the position cut among equal keys
//           on them in shared memory (more than kCandCap: CTA 0 resolves by streaming the
//           row instead);
//   emit    each CTA marks its slice's selected keys in the row's bitmap; the last CTA
//           writes the set bits in order.
// The workspace is zeroed once by the caller; every kernel leaves its counters at zero.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/attention/kv_device.cuh"

namespace fp4moe::cuda::indexer::topk {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kRowKeys = 16384;                         // one-CTA rows (keys in shared memory)
constexpr int kSliceKeys = 4096;                        // longer rows: keys per CTA (default, and the unit)
constexpr int kMaxSliceKeys = 16 * kSliceKeys;          // 64K keys per CTA: 64 per thread
constexpr int kBins0 = 4096;                            // first digit: key bits [31:20]
constexpr int kCandCap = 8192;                          // candidates resolved in shared memory
constexpr int kPosBits = 22;                            // positions < 2^22 (the tie cut's radix)
constexpr uint32_t kPosMax = (1u << kPosBits) - 1;
constexpr int kScratchInts = 64;
constexpr int kNoCut = 0x7fffffff;

// Per row, in the workspace. arrive[] and cand_n are zero between calls.
struct RowState {
  uint32_t arrive[3];
  uint32_t cand_n;
  int32_t bin0, need, bin_count, resolved;  // from pass0: the k-th key's bin, keys still needed from it
  uint32_t mask, t;                         // the rule: (key & mask) > t, or == t and pos <= p_cut
  int32_t p_cut;
  int32_t pad[5];
};
static_assert(sizeof(RowState) == 64, "");

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
  int slice_keys = kSliceKeys;  // rows longer than kRowKeys: keys per CTA (a multiple of kSliceKeys)
  // Workspace (rows longer than kRowKeys): per row a RowState, a kBins0 histogram, kCandCap
  // candidates (key, position) and bitmap_words words of selection bits.
  RowState* state;
  int32_t* hist0;
  uint2* cand;
  uint32_t* bitmap;
  int64_t bitmap_words;
};

// Host: the workspace's layout for `rows` rows of up to max_ctx keys (all zero sizes when
// max_ctx <= kRowKeys: one launch, no workspace), and each kernel's dynamic shared memory.
struct Layout {
  int64_t slices = 0, bitmap_words = 0;
  size_t state = 0, hist = 0, cand = 0, bitmap = 0, total = 0;  // byte offsets, size
};
inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }
inline Layout workspace_layout(int64_t rows, int max_ctx, int slice_keys = kSliceKeys) {
  Layout l;
  if (max_ctx <= kRowKeys) return l;
  l.slices = (max_ctx + slice_keys - 1) / slice_keys;
  l.bitmap_words = l.slices * (slice_keys / 32);
  const size_t r = size_t(rows);
  l.hist = align256(r * sizeof(RowState));
  l.cand = l.hist + align256(r * kBins0 * sizeof(int32_t));
  l.bitmap = l.cand + align256(r * kCandCap * 2 * sizeof(uint32_t));
  l.total = l.bitmap + align256(r * size_t(l.bitmap_words) * sizeof(uint32_t));
  return l;
}
// Wider slices for many long rows: the smallest multiple of kSliceKeys that keeps rows x slices
// within `ctas` CTAs (two per SM is the occupancy at 1024 threads), at most kMaxSliceKeys. Each
// CTA pays a fixed cost (a 4K-bin histogram cleared and flushed, an arrival fence, three
// launches' tails); 4K-key slices make B 256 / 128K 8,192 CTAs per kernel.
inline int slice_keys_for(int64_t rows, int max_ctx, int ctas) {
  int slice = kSliceKeys;
  const int64_t r = rows > 0 ? rows : 1, c = ctas > 0 ? ctas : 1;
  while (slice < kMaxSliceKeys && r * ((max_ctx + slice - 1) / slice) > c) slice += kSliceKeys;
  return slice;
}
inline bool slice_keys_valid(int slice_keys) {
  return slice_keys >= kSliceKeys && slice_keys <= kMaxSliceKeys && slice_keys % kSliceKeys == 0;
}
inline size_t pass0_smem_bytes(int max_ctx) {
  const int row_keys = max_ctx < kRowKeys ? max_ctx : kRowKeys;
  return (kBins0 + kScratchInts) * sizeof(int) + size_t(row_keys) * sizeof(uint32_t);
}
inline size_t collect_smem_bytes() { return (2048 + kScratchInts) * sizeof(int) + kCandCap * 2 * sizeof(uint32_t); }
// Points p's workspace arrays into ws (layout l).
inline void bind_workspace(Params& p, void* ws, const Layout& l) {
  auto* b = static_cast<unsigned char*>(ws);
  p.state = reinterpret_cast<RowState*>(b + l.state);
  p.hist0 = reinterpret_cast<int32_t*>(b + l.hist);
  p.cand = reinterpret_cast<uint2*>(b + l.cand);
  p.bitmap = reinterpret_cast<uint32_t*>(b + l.bitmap);
  p.bitmap_words = l.bitmap_words;
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

__device__ __forceinline__ const int32_t* row_pages(const Params& p, int row) {
  return p.out_slot ? p.page_indices + p.page_indptr[attention::request_of(p.qo_indptr, p.num_requests, row)]
                    : nullptr;
}

__device__ __forceinline__ void emit(const Params& p, const int32_t* pages, int row, int n, int pos) {
  p.out_pos[int64_t(row) * p.top_k + n] = pos;
  if (p.out_slot)
    p.out_slot[int64_t(row) * p.top_k + n] = pos < 0 ? -1 : int32_t(attention::slot_of(pages, p.page_shift, pos));
}

// The keys still in play, (key & mask) == prefix, of which `need` are wanted (the largest).
struct Sel {
  uint32_t prefix, mask;
  int need;
};

// After a histogram of kBins bins in shared memory: the bin holding the need-th largest key.
// Sets sel (prefix / mask gain the bin's digit at `shift`, need drops by the keys above it)
// and returns whether the bin is taken whole. Every thread calls; uniform result.
template <int kBins>
__device__ __forceinline__ bool take_bin(const int* hist, int shift, Sel& sel, int* scratch) {
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
  return bin_count == sel.need;
}

// One histogram pass over n items: get(i, key) -> false to skip item i; counts the keys in
// play by their digit (key >> shift) & (kBins - 1), then take_bin. hist: kBins shared ints.
template <int kBins, typename Get>
__device__ __forceinline__ bool radix_pass(Get get, int n, int shift, Sel& sel, int* hist, int* scratch) {
  const int tid = int(threadIdx.x);
  for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  for (int base = 0; base < n; base += kThreads) {  // uniform trip count: the warp vote below
    const int i = base + tid;
    int digit = -1;
    uint32_t key = 0;
    if (i < n && get(i, key) && (key & sel.mask) == sel.prefix) digit = int((key >> shift) & uint32_t(kBins - 1));
    // Lanes with the same digit add once (scores crowd a few bins).
    const unsigned peers = __match_any_sync(prims::kFullMask, digit);
    if (digit >= 0 && prims::lane_id() == __ffs(int(peers)) - 1) atomicAdd(&hist[digit], __popc(peers));
  }
  __syncthreads();
  return take_bin<kBins>(hist, shift, sel, scratch);
}

// A whole row of ctx (> k) keys in shared memory: T by up to three passes, then the ordered
// selection. keys: ctx shared uint32, hist: kBins0 shared ints.
__device__ __forceinline__ void select_row_in_smem(const Params& p, int row, int ctx, const float* s, uint32_t* keys,
                                                   int* hist, int* scratch) {
  const int tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int32_t* pages = row_pages(p, row);
  for (int i = tid; i < ctx; i += kThreads) keys[i] = order_key(s[i]);
  __syncthreads();
  Sel sel{0u, 0u, p.top_k};
  auto get = [&](int i, uint32_t& key) {
    key = keys[i];
    return true;
  };
  if (!radix_pass<kBins0>(get, ctx, 20, sel, hist, scratch))
    if (!radix_pass<2048>(get, ctx, 9, sel, hist, scratch)) radix_pass<512>(get, ctx, 0, sel, hist, scratch);

  // Ordered: warp w owns keys [w * chunk, (w + 1) * chunk), 32 consecutive keys per step.
  const int chunk = ((ctx + kThreads - 1) / kThreads) * 32;
  const int w0 = warp * chunk;
  int gt_w = 0, eq_w = 0;
  for (int j = 0; j < chunk; j += 32) {
    const int i = w0 + j + lane;
    const uint32_t km = i < ctx ? keys[i] & sel.mask : 0u;
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
    const uint32_t km = i < ctx ? keys[i] & sel.mask : 0u;
    const bool eq = i < ctx && km == sel.prefix;
    const unsigned eqb = __ballot_sync(prims::kFullMask, eq);
    const bool take = (i < ctx && km > sel.prefix) || (eq && eq_seen + __popc(eqb & prims::lanemask_lt()) < sel.need);
    const unsigned tb = __ballot_sync(prims::kFullMask, take);
    const int n = out + __popc(tb & prims::lanemask_lt());
    if (take && n < p.top_k) emit(p, pages, row, n, i);
    out += __popc(tb);
    eq_seen += __popc(eqb);
  }
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

// Dynamic shared memory: [hist0 kBins0 ints][scratch kScratchInts ints][row keys].
__global__ void __launch_bounds__(kThreads) topk_pass0_kernel(const Params p) {
  FP4MOE_DYNAMIC_SMEM(int, hist);
  int* scratch = hist + kBins0;
  uint32_t* keys = reinterpret_cast<uint32_t*>(scratch + kScratchInts);
  const int row = int(blockIdx.y), tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int ctx = row_ctx(p, row);
  const float* s = p.scores + int64_t(row) * p.score_stride;
  if (ctx <= kRowKeys) {
    if (blockIdx.x != 0) return;
    if (ctx <= p.top_k) {  // dense: every position, then -1 padding
      const int32_t* pages = row_pages(p, row);
      for (int i = tid; i < p.top_k; i += kThreads) emit(p, pages, row, i, i < ctx ? i : -1);
      return;
    }
    select_row_in_smem(p, row, ctx, s, keys, hist, scratch);
    return;
  }
  const int slices = (ctx + p.slice_keys - 1) / p.slice_keys;
  if (int(blockIdx.x) >= slices) return;
  for (int b = tid; b < kBins0; b += kThreads) hist[b] = 0;
  __syncthreads();
  const int base = int(blockIdx.x) * p.slice_keys + warp * (p.slice_keys / kWarps);
  const int steps = p.slice_keys / kThreads;  // 32 keys per warp step
#pragma unroll 4
  for (int j = 0; j < steps; ++j) {
    const int i = base + j * 32 + lane;
    const int digit = i < ctx ? int(order_key(s[i]) >> 20) : -1;
    const unsigned peers = __match_any_sync(prims::kFullMask, digit);
    if (digit >= 0 && lane == __ffs(int(peers)) - 1) atomicAdd(&hist[digit], __popc(peers));
  }
  __syncthreads();
  int* g_hist = p.hist0 + int64_t(row) * kBins0;
  for (int b = tid; b < kBins0; b += kThreads)
    if (hist[b] != 0) atomicAdd(&g_hist[b], hist[b]);
  RowState& st = p.state[row];
  if (!last_to_arrive(&st.arrive[0], uint32_t(slices), scratch)) return;
  for (int b = tid; b < kBins0; b += kThreads) {
    hist[b] = __ldcg(&g_hist[b]);
    g_hist[b] = 0;
  }
  __syncthreads();
  Sel sel{0u, 0u, p.top_k};
  const bool whole = take_bin<kBins0>(hist, 20, sel, scratch);
  if (tid == 0) {
    st.bin0 = int32_t(sel.prefix >> 20);
    st.need = sel.need;
    st.bin_count = hist[sel.prefix >> 20];
    st.resolved = whole;
    st.mask = sel.mask;
    st.t = sel.prefix;
    st.p_cut = kNoCut;
  }
}

// T and the position cut of a long row from the keys of its pass-0 bin: get(i, key, pos) over
// n items (false: not a key of the row). hist: 2048 shared ints. Writes the rule into st.
template <typename Get>
__device__ __forceinline__ void resolve_rule(Get get, int n, RowState& st, int* hist, int* scratch) {
  Sel sel{uint32_t(st.bin0) << 20, 0xfff00000u, st.need};
  auto key_of = [&](int i, uint32_t& key) {
    int pos = 0;
    return get(i, key, pos);
  };
  bool whole = radix_pass<2048>(key_of, n, 9, sel, hist, scratch);
  if (!whole) whole = radix_pass<512>(key_of, n, 0, sel, hist, scratch);
  int p_cut = kNoCut;
  if (!whole) {  // sel.need of the keys equal to T (sel.prefix, all 32 bits): the lowest positions
    const uint32_t t = sel.prefix;
    auto pos_key = [&](int i, uint32_t& key) {
      int pos = 0;
      if (!get(i, key, pos) || key != t) return false;
      key = kPosMax - uint32_t(pos);  // the largest of these = the lowest positions
      return true;
    };
    Sel ps{0u, 0u, sel.need};
    radix_pass<2048>(pos_key, n, 11, ps, hist, scratch);
    radix_pass<2048>(pos_key, n, 0, ps, hist, scratch);
    p_cut = int(kPosMax - ps.prefix);
  }
  if (threadIdx.x == 0) {
    st.mask = sel.mask;
    st.t = sel.prefix;
    st.p_cut = p_cut;
  }
}

// Dynamic shared memory: [hist 2048 ints][scratch kScratchInts ints][keys kCandCap][pos kCandCap].
__global__ void __launch_bounds__(kThreads) topk_collect_kernel(const Params p) {
  FP4MOE_DYNAMIC_SMEM(int, hist);
  int* scratch = hist + 2048;
  uint32_t* ckey = reinterpret_cast<uint32_t*>(scratch + kScratchInts);
  int32_t* cpos = reinterpret_cast<int32_t*>(ckey + kCandCap);
  const int row = int(blockIdx.y), tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int ctx = row_ctx(p, row);
  if (ctx <= kRowKeys) return;
  const int slices = (ctx + p.slice_keys - 1) / p.slice_keys;
  if (int(blockIdx.x) >= slices) return;
  RowState& st = p.state[row];
  if (st.resolved) return;
  const float* s = p.scores + int64_t(row) * p.score_stride;
  if (st.bin_count > kCandCap) {  // too many for shared memory: CTA 0 streams the row
    if (blockIdx.x != 0) return;
    resolve_rule(
        [&](int i, uint32_t& key, int& pos) {
          key = order_key(s[i]);
          pos = i;
          return true;
        },
        ctx, st, hist, scratch);
    return;
  }
  uint2* cand = p.cand + int64_t(row) * kCandCap;
  const uint32_t bin0 = uint32_t(st.bin0);
  const int base = int(blockIdx.x) * p.slice_keys + warp * (p.slice_keys / kWarps);
  const int steps = p.slice_keys / kThreads;  // 32 keys per warp step
#pragma unroll 4
  for (int j = 0; j < steps; ++j) {
    const int i = base + j * 32 + lane;
    const uint32_t key = i < ctx ? order_key(s[i]) : 0u;
    const bool in = i < ctx && (key >> 20) == bin0;
    const unsigned b = __ballot_sync(prims::kFullMask, in);
    uint32_t at = 0;
    if (lane == 0 && b != 0u) at = atomicAdd(&st.cand_n, uint32_t(__popc(b)));
    at = __shfl_sync(prims::kFullMask, at, 0) + uint32_t(__popc(b & prims::lanemask_lt()));
    if (in && at < uint32_t(kCandCap)) cand[at] = uint2{key, uint32_t(i)};
  }
  if (!last_to_arrive(&st.arrive[1], uint32_t(slices), scratch)) return;
  const uint32_t n_all = __ldcg(&st.cand_n);
  const int n = int(n_all < uint32_t(kCandCap) ? n_all : uint32_t(kCandCap));
  for (int i = tid; i < n; i += kThreads) {
    const uint2 c = __ldcg(&cand[i]);
    ckey[i] = c.x;
    cpos[i] = int32_t(c.y);
  }
  __syncthreads();
  if (tid == 0) st.cand_n = 0u;
  resolve_rule(
      [&](int i, uint32_t& key, int& pos) {
        key = ckey[i];
        pos = cpos[i];
        return true;
      },
      n, st, hist, scratch);
}

// Static shared memory only.
__global__ void __launch_bounds__(kThreads) topk_emit_kernel(const Params p) {
  __shared__ int scratch[kScratchInts];
  const int row = int(blockIdx.y), tid = int(threadIdx.x), lane = prims::lane_id(), warp = prims::warp_id();
  const int ctx = row_ctx(p, row);
  if (ctx <= kRowKeys) return;
  const int slices = (ctx + p.slice_keys - 1) / p.slice_keys;
  if (int(blockIdx.x) >= slices) return;
  RowState& st = p.state[row];
  const uint32_t mask = st.mask, t = st.t;
  const int p_cut = st.p_cut;
  const float* s = p.scores + int64_t(row) * p.score_stride;
  uint32_t* bits = p.bitmap + int64_t(row) * p.bitmap_words;
  const int base = int(blockIdx.x) * p.slice_keys + warp * (p.slice_keys / kWarps);
  const int steps = p.slice_keys / kThreads;  // 32 keys per warp step
#pragma unroll 4
  for (int j = 0; j < steps; ++j) {
    const int i = base + j * 32 + lane;
    const uint32_t km = i < ctx ? order_key(s[i]) & mask : 0u;
    const bool take = i < ctx && (km > t || (km == t && i <= p_cut));
    const unsigned b = __ballot_sync(prims::kFullMask, take);
    if (lane == 0) bits[(base + j * 32) >> 5] = b;
  }
  if (!last_to_arrive(&st.arrive[2], uint32_t(slices), scratch)) return;
  const int32_t* pages = row_pages(p, row);
  const int words = (ctx + 31) / 32;
  const int per = (words + kThreads - 1) / kThreads;
  const int w0 = tid * per, w1 = w0 + per < words ? w0 + per : words;
  int cnt = 0;
  for (int w = w0; w < w1; ++w) cnt += __popc(__ldcg(&bits[w]));
  int total = 0;
  int out = prims::block_exclusive_sum<kThreads>(cnt, total, scratch);
  for (int w = w0; w < w1; ++w) {
    uint32_t b = __ldcg(&bits[w]);
    while (b != 0u) {
      const int bit = __ffs(int(b)) - 1;
      if (out < p.top_k) emit(p, pages, row, out, w * 32 + bit);
      ++out;
      b &= b - 1u;
    }
  }
  for (int i = total + tid; i < p.top_k; i += kThreads) emit(p, pages, row, i, -1);  // (never: ctx > k)
}

}  // namespace

}  // namespace fp4moe::cuda::indexer::topk
