// Device building blocks of sample() (sample_f32.cu), generic over the source they read:
// RowSrc (the whole row, ids in order) or CandSrc (a candidate list in shared memory: a rank
// prefix of the row, every tie group whole, ids in any order). One CTA of kThreads runs them.
//   radix_select   the rank-`need` key (count or fixed-point mass), digit by digit
//   for_each_at_least  every key >= v, with the id rank among keys equal to v when asked
//   finish_row     truncation (top-k, top-p, min-p), the Gumbel draw and the logprobs of one
//                  row, by core/sampling_scheme.hpp's scheme
#pragma once

#include "cuda/common/device_prims.cuh"  // first: under FP4MOE_CUDA_EMU it brings the emulator
#include "cuda/sampling/sample_args.hpp"

#if !defined(FP4MOE_CUDA_EMU)
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif

namespace fp4moe::cuda::sampling::detail {

using cpu::float_order_key;
using cpu::kMassOne;
using cpu::mass_weight;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCandCap = 4096;               // candidates one CTA selects from in shared memory
constexpr uint32_t kAllKept = 0xFFFFFFFFu;   // "every equal value kept"

struct Prefix {  // the first n of the rank order: key > v, or key == v and id-rank among equals < e
  uint32_t v = 0;
  uint32_t e = kAllKept;
  uint32_t eq_total = 0;  // how many keys equal v (within the selection's restriction)
  uint64_t n = 0;         // length of the prefix
};

struct Common {
  union {  // block scans / reductions (one at a time)
#if defined(FP4MOE_CUDA_EMU)
    unsigned long long u64[kWarps + 1];
    int i32[kWarps + 1];
#else
    cub::BlockScan<unsigned long long, kThreads>::TempStorage scan_u64;
    cub::BlockScan<int, kThreads>::TempStorage scan_int;
    cub::BlockReduce<unsigned long long, kThreads>::TempStorage reduce;
#endif
  } tmp;
  unsigned long long bcast_u64[3];
  uint32_t bcast_u32[2];
  int32_t top_n;
  int32_t flag;
  int32_t top_id[kMaxTopLogprobs];
  uint32_t top_key[kMaxTopLogprobs];
};

template <int kDigitBits>
struct Hist {
  static constexpr int kBins = 1 << kDigitBits;
  unsigned long long w[kBins];
  uint32_t c[kBins];
};


// (key desc, id asc) as one u64 for a max reduction.
__device__ __forceinline__ unsigned long long pack_rank(uint32_t key, int i) {
  return (static_cast<unsigned long long>(key) << 32) | (0xFFFFFFFFu - uint32_t(i));
}
__device__ __forceinline__ int unpack_id(unsigned long long p) { return int(0xFFFFFFFFu - uint32_t(p)); }

struct RowSrc {  // x_i = logit_i / temperature (IEEE), or the logit itself when greedy
  const float* l;
  float t;
  bool scale;
  int n;
  static constexpr bool kIdOrdered = true;
  __device__ __forceinline__ int size() const { return n; }
  __device__ __forceinline__ int id(int j) const { return j; }
  __device__ __forceinline__ float x(int j) const { return scale ? __fdiv_rn(l[j], t) : l[j]; }
};

struct CandSrc {
  const int32_t* ids;
  const float* xs;
  int n;
  static constexpr bool kIdOrdered = false;
  __device__ __forceinline__ int size() const { return n; }
  __device__ __forceinline__ int id(int j) const { return ids[j]; }
  __device__ __forceinline__ float x(int j) const { return xs[j]; }
};

// Block-wide scans and reductions (every thread calls; the result in every thread; the shared
// storage free again on return). On the device: CUB's (the register profile the kernels were
// tuned with); in the CUDA emulator (tests/ops/sampling_emu_test), which has no CUB, the same
// contract by warp shuffles — exclusive sums and integer reductions are exact, so the two give
// the same values.
#if defined(FP4MOE_CUDA_EMU)
template <class T>
__device__ __forceinline__ T emu_exclusive_sum(T v, T& total, T* scratch) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  T incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  T run = 0;
  for (int w = 0; w < warp; ++w) run += scratch[w];
  T all = run;
  for (int w = warp; w < kWarps; ++w) all += scratch[w];
  __syncthreads();
  total = all;
  return run + incl - v;
}
template <class T, class Op>
__device__ __forceinline__ T emu_all_reduce(T v, T* scratch, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  __syncthreads();
  return r;
}
#endif

__device__ inline unsigned long long block_exclusive_sum(Common& cm, unsigned long long v, unsigned long long& total) {
#if defined(FP4MOE_CUDA_EMU)
  return emu_exclusive_sum(v, total, cm.tmp.u64);
#else
  unsigned long long r;
  cub::BlockScan<unsigned long long, kThreads>(cm.tmp.scan_u64).ExclusiveSum(v, r, total);
  __syncthreads();
  return r;
#endif
}

__device__ inline int block_exclusive_sum(Common& cm, int v, int& total) {
#if defined(FP4MOE_CUDA_EMU)
  return emu_exclusive_sum(v, total, cm.tmp.i32);
#else
  int r;
  cub::BlockScan<int, kThreads>(cm.tmp.scan_int).ExclusiveSum(v, r, total);
  __syncthreads();
  return r;
#endif
}

__device__ inline unsigned long long block_sum(Common& cm, unsigned long long v) {
#if defined(FP4MOE_CUDA_EMU)
  return emu_all_reduce(v, cm.tmp.u64, [](unsigned long long a, unsigned long long b) { return a + b; });
#else
  const unsigned long long s = cub::BlockReduce<unsigned long long, kThreads>(cm.tmp.reduce).Sum(v);
  if (threadIdx.x == 0) cm.bcast_u64[0] = s;
  __syncthreads();
  const unsigned long long r = cm.bcast_u64[0];
  __syncthreads();
  return r;
#endif
}

__device__ inline unsigned long long block_max(Common& cm, unsigned long long v) {
#if defined(FP4MOE_CUDA_EMU)
  return emu_all_reduce(v, cm.tmp.u64, [](unsigned long long a, unsigned long long b) { return a > b ? a : b; });
#else
  const unsigned long long s = cub::BlockReduce<unsigned long long, kThreads>(cm.tmp.reduce)
                                   .Reduce(v, [](auto a, auto b) { return a > b ? a : b; });
  if (threadIdx.x == 0) cm.bcast_u64[0] = s;
  __syncthreads();
  const unsigned long long r = cm.bcast_u64[0];
  __syncthreads();
  return r;
#endif
}

// The rank-`need` position of the order (count mode: weight 1 per key; mass mode: the
// fixed-point weight), among keys >= restrict_min. Returns v with weight(> v) < need <=
// weight(>= v), the count of keys > v, and (mass mode) the weight of keys > v. The source
// must hold every key >= v (a rank prefix of the row reaching `need`).
template <bool kMass, int kDigitBits, class Src>
__device__ void radix_select(Common& cm, Hist<kDigitBits>& h, const Src& src, float m, uint32_t restrict_min,
                             uint64_t need, uint32_t& v_out, uint64_t& count_gt, uint64_t& weight_gt,
                             uint32_t& eq_total) {
  constexpr int kBins = Hist<kDigitBits>::kBins;
  constexpr int kPerThread = kBins / kThreads;
  static_assert(kBins % kThreads == 0);
  constexpr int kPasses = (32 + kDigitBits - 1) / kDigitBits;
  uint32_t prefix = 0, mask = 0;
  count_gt = 0;
  weight_gt = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = 32 - (pass + 1) * kDigitBits > 0 ? 32 - (pass + 1) * kDigitBits : 0;
    const int bits = 32 - pass * kDigitBits - shift;
    const uint32_t dmask = (1u << bits) - 1u;
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      h.c[b] = 0;
      if (kMass) h.w[b] = 0;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < src.size(); j += kThreads) {
      const float x = src.x(j);
      const uint32_t key = float_order_key(x);
      if (key < restrict_min || (key & mask) != prefix) continue;
      const int d = int((key >> shift) & dmask);
      atomicAdd(&h.c[d], 1u);
      if (kMass) {
        const uint64_t w = mass_weight(x, m);
        if (w) atomicAdd(&h.w[d], static_cast<unsigned long long>(w));
      }
    }
    __syncthreads();
    // Walk the bins from the highest digit down: thread t owns bins kBins-1-(t*kPerThread+j).
    unsigned long long local_w = 0, local_c = 0;
    for (int j = 0; j < kPerThread; ++j) {
      const int d = kBins - 1 - (threadIdx.x * kPerThread + j);
      local_c += h.c[d];
      if (kMass) local_w += h.w[d];
    }
    unsigned long long above_w = 0, tot;
    const unsigned long long above_c = block_exclusive_sum(cm, local_c, tot);
    if (kMass) above_w = block_exclusive_sum(cm, local_w, tot);
    unsigned long long acc_c = above_c, acc_w = above_w;
    for (int j = 0; j < kPerThread; ++j) {
      const int d = kBins - 1 - (threadIdx.x * kPerThread + j);
      const unsigned long long hc = h.c[d];
      const unsigned long long hw = kMass ? h.w[d] : hc;
      const unsigned long long acc = kMass ? acc_w : acc_c;
      if (acc < need && acc + hw >= need) {
        cm.bcast_u32[0] = uint32_t(d);
        cm.bcast_u32[1] = uint32_t(hc);
        cm.bcast_u64[1] = acc_c;
        cm.bcast_u64[2] = acc_w;
      }
      acc_c += hc;
      acc_w += kMass ? h.w[d] : 0;
    }
    __syncthreads();
    const uint32_t d = cm.bcast_u32[0];
    prefix |= d << shift;
    mask |= dmask << shift;
    count_gt += cm.bcast_u64[1];
    weight_gt += cm.bcast_u64[2];
    need -= kMass ? cm.bcast_u64[2] : cm.bcast_u64[1];
    eq_total = cm.bcast_u32[1];
    __syncthreads();
  }
  v_out = prefix;
}

// fn(id, x, key, eq_rank) for every key >= v, where eq_rank (valid when `ordered` and key == v)
// is the id rank among the keys equal to v: a block scan in id order over the row, a count of
// the smaller ids among equal keys over a candidate list.
template <class Src, class Fn>
__device__ void for_each_at_least(Common& cm, const Src& src, uint32_t v, bool ordered, Fn&& fn) {
  if (!ordered || !Src::kIdOrdered) {
    for (int j = threadIdx.x; j < src.size(); j += kThreads) {
      const float x = src.x(j);
      const uint32_t key = float_order_key(x);
      if (key < v) continue;
      uint32_t rank = 0;
      if (ordered && key == v) {
        const int id = src.id(j);
        for (int q = 0; q < src.size(); ++q) rank += float_order_key(src.x(q)) == v && src.id(q) < id;
      }
      fn(src.id(j), x, key, rank);
    }
    return;
  }
  uint32_t base = 0;
  for (int j0 = 0; j0 < src.size(); j0 += kThreads) {
    const int j = j0 + threadIdx.x;
    float x = 0.0f;
    uint32_t key = 0;
    if (j < src.size()) {
      x = src.x(j);
      key = float_order_key(x);
    }
    const int eq = j < src.size() && key == v;
    int total;
    const int rank = block_exclusive_sum(cm, eq, total);
    if (j < src.size() && key >= v) fn(src.id(j), x, key, base + uint32_t(rank));
    base += uint32_t(total);
    __syncthreads();
  }
}

__device__ __forceinline__ bool in_prefix(const Prefix& p, uint32_t key, uint32_t eq_rank) {
  return key > p.v || (key == p.v && eq_rank < p.e);
}

struct RowFlags {
  bool greedy, want_lp, top_k_on, top_p_on, min_p_on;
  __device__ RowFlags(const SamplingParams& P, int V)
      : greedy(P.greedy()),
        want_lp(P.logprobs_top_n >= 0),
        top_k_on(!greedy && P.top_k_on(V)),
        top_p_on(!greedy && P.top_p < 1.0f),
        min_p_on(!greedy && P.min_p > 0.0f) {}
  __device__ bool truncates() const { return top_k_on || top_p_on || min_p_on; }
  __device__ bool plain() const { return !greedy && !truncates(); }  // the draw is over every token
  __device__ bool needs_mass() const { return want_lp || truncates(); }
};

__device__ inline void write_empty_top(const SampleArgs& a, int row, int from) {
  if (a.top_ids)
    for (int j = from + int(threadIdx.x); j < kMaxTopLogprobs; j += kThreads) {
      a.top_ids[row * kMaxTopLogprobs + j] = kNoToken;
      a.top_logprobs[row * kMaxTopLogprobs + j] = 0.0f;
    }
}

// The rest of one row once its max (m at `argmax`), its total mass z_all (when needed) and, for
// a plain temperature row, its Gumbel winner are known: truncation and draw over `src` (which
// holds the kept prefix, the top-k prefix and the top-n), then the outputs. `row_x` reads x by id.
template <class Src, int kDigitBits>
__device__ void finish_row(Common& cm, Hist<kDigitBits>& h, const Src& src, const RowSrc& row_x, const SampleArgs& a,
                           const SamplingParams& P, int row, float m, int argmax, int plain_token, uint64_t z_all) {
  const int tid = threadIdx.x;
  const int V = a.vocab;
  const RowFlags f(P, V);
  int token = argmax;
  if (f.plain()) token = plain_token;
  if (!f.greedy && f.truncates()) {
    Prefix pk;  // the top-k prefix (all when off)
    pk.n = uint64_t(V);
    if (f.top_k_on) {
      uint64_t cgt, wgt;
      radix_select<false>(cm, h, src, m, 0u, uint64_t(P.top_k), pk.v, cgt, wgt, pk.eq_total);
      pk.e = uint32_t(uint64_t(P.top_k) - cgt);
      pk.n = uint64_t(P.top_k);
    }
    Prefix cut = pk;
    if (f.top_p_on) {
      uint64_t z_k = z_all;
      if (f.top_k_on) {
        unsigned long long s_gt = 0;
        for (int j = tid; j < src.size(); j += kThreads) {
          const float x = src.x(j);
          if (float_order_key(x) > pk.v) s_gt += mass_weight(x, m);
        }
        z_k = block_sum(cm, s_gt) + uint64_t(pk.e) * mass_weight(cpu::float_from_order_key(pk.v), m);
      }
      const double t = ceil(double(P.top_p) * double(z_k));
      const uint64_t t_int = uint64_t(t);
      const uint64_t target = t_int < z_k ? t_int : z_k;
      Prefix pp;
      uint64_t cgt, wgt;
      radix_select<true>(cm, h, src, m, f.top_k_on ? pk.v : 0u, target, pp.v, cgt, wgt, pp.eq_total);
      const uint64_t w_eq = mass_weight(cpu::float_from_order_key(pp.v), m);
      const uint64_t c = w_eq ? (target - wgt + w_eq - 1) / w_eq : 1;
      pp.e = uint32_t(c);
      pp.n = cgt + c;
      if (pp.n < cut.n) cut = pp;
    }
    const float min_cut = f.min_p_on ? m + logf(P.min_p) : 0.0f;
    const bool cuts = f.top_k_on || f.top_p_on;
    const bool ordered = cut.e != kAllKept && cut.e < cut.eq_total;
    const uint64_t seed = P.seed;
    const uint64_t step = a.draw_index ? uint64_t(uint32_t(a.draw_index[row])) : 0;
    unsigned long long win = 0;
    for_each_at_least(cm, src, cuts ? cut.v : 0u, ordered, [&](int i, float x, uint32_t key, uint32_t eq_rank) {
      if (cuts && !in_prefix(cut, key, ordered ? eq_rank : 0u)) return;
      if (f.min_p_on && !(x >= min_cut)) return;
      const float g = cpu::gumbel_key(x, cpu::sample_bits(seed, step, uint32_t(i)));
      const unsigned long long r = pack_rank(float_order_key(g), i);
      win = r > win ? r : win;
    });
    win = block_max(cm, win);
    token = unpack_id(win);
  }
  if (tid == 0) a.tokens[row] = token;
  if (!f.want_lp) {
    if (tid == 0 && a.logprob) a.logprob[row] = 0.0f;
    write_empty_top(a, row, 0);
    return;
  }
  const double lse = double(m) + log(double(z_all) / kMassOne);
  if (tid == 0 && a.logprob) a.logprob[row] = float(double(row_x.x(token)) - lse);
  const int n = P.logprobs_top_n < V ? P.logprobs_top_n : V;
  if (n <= 0 || !a.top_ids) {
    write_empty_top(a, row, 0);
    return;
  }
  Prefix pn;
  uint64_t cgt, wgt;
  radix_select<false>(cm, h, src, m, 0u, uint64_t(n), pn.v, cgt, wgt, pn.eq_total);
  pn.e = uint32_t(uint64_t(n) - cgt);
  if (tid == 0) cm.top_n = 0;
  __syncthreads();
  const bool ordered = pn.e < pn.eq_total;
  for_each_at_least(cm, src, pn.v, ordered, [&](int i, float, uint32_t key, uint32_t eq_rank) {
    if (!in_prefix(pn, key, ordered ? eq_rank : 0u)) return;
    const int slot = atomicAdd(&cm.top_n, 1);
    if (slot < kMaxTopLogprobs) {
      cm.top_id[slot] = i;
      cm.top_key[slot] = key;
    }
  });
  __syncthreads();
  if (tid == 0) {  // <= 20 entries: insertion sort by (key desc, id asc)
    const int c = cm.top_n < n ? cm.top_n : n;
    for (int q = 1; q < c; ++q)
      for (int r = q; r > 0; --r) {
        const bool before = cm.top_key[r] > cm.top_key[r - 1] ||
                            (cm.top_key[r] == cm.top_key[r - 1] && cm.top_id[r] < cm.top_id[r - 1]);
        if (!before) break;
        const int ti = cm.top_id[r];
        const uint32_t tk = cm.top_key[r];
        cm.top_id[r] = cm.top_id[r - 1];
        cm.top_key[r] = cm.top_key[r - 1];
        cm.top_id[r - 1] = ti;
        cm.top_key[r - 1] = tk;
      }
    for (int q = 0; q < c; ++q) {
      a.top_ids[row * kMaxTopLogprobs + q] = cm.top_id[q];
      a.top_logprobs[row * kMaxTopLogprobs + q] = float(double(row_x.x(cm.top_id[q])) - lse);
    }
  }
  write_empty_top(a, row, n);
}

}  // namespace fp4moe::cuda::sampling::detail
