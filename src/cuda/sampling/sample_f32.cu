// sample(): one CTA of kThreads per row over F32 logits (cpu/sampling_scheme.hpp's scheme).
//
// Passes over the row (each a read of vocab floats; L2 holds a row, not a batch of them):
//   penalties   only rows with one: the listed tokens, in place, once per distinct token
//   max         always: the max (and the greedy argmax), ties to the lower id
//   top-k       3 count-histogram passes (11 + 11 + 10 bits of the order key)
//   mass        when top-p or logprobs: Σ of fixed-point weights (and Σ above the top-k cut)
//   top-p       3 weight-histogram passes restricted to the top-k prefix
//   draw        Philox bits + Gumbel key for every kept token, block argmax
//   top-n       3 count passes + one gather pass (logprobs_top_n > 0)
// Where a cut falls inside a run of equal values and keeps only part of it, the pass that
// needs it walks the row in id order with a block scan (ties to the lower id, exactly).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/sampling/sampling.hpp"
#include "cuda/common/cuda_check.hpp"

namespace fp4moe::cuda::sampling {
namespace {

using cpu::float_order_key;
using cpu::kMassOne;

constexpr int kThreads = 512;
constexpr int kBins = 2048;                  // 11-bit digits
constexpr int kBinsPerThread = kBins / kThreads;
constexpr uint32_t kAllKept = 0xFFFFFFFFu;   // "every equal value kept"

struct Prefix {  // the first n of the rank order: key > v, or key == v and id-rank among equals < e
  uint32_t v = 0;
  uint32_t e = kAllKept;
  uint32_t eq_total = 0;  // how many keys equal v (within the selection's restriction)
  uint64_t n = 0;         // length of the prefix
};

struct Smem {
  unsigned long long hist_w[kBins];
  uint32_t hist_c[kBins];
  union {
    cub::BlockScan<unsigned long long, kThreads>::TempStorage scan_u64;
    cub::BlockScan<int, kThreads>::TempStorage scan_int;
    cub::BlockReduce<unsigned long long, kThreads>::TempStorage reduce;
  } tmp;
  unsigned long long bcast_u64[3];
  uint32_t bcast_u32[2];
  int32_t top_n;
  int32_t top_id[kMaxTopLogprobs];
  uint32_t top_key[kMaxTopLogprobs];
};

__device__ __forceinline__ uint64_t mass_weight(float x, float m) {
  const float d = x - m;
  return uint64_t(double(expf(d)) * kMassOne);
}

struct RowX {  // x_i = logit_i / temperature (IEEE), or the logit itself when greedy
  const float* l;
  float t;
  bool scale;
  __device__ __forceinline__ float operator()(int i) const { return scale ? __fdiv_rn(l[i], t) : l[i]; }
};

__device__ unsigned long long block_sum(Smem& sm, unsigned long long v) {
  const unsigned long long s = cub::BlockReduce<unsigned long long, kThreads>(sm.tmp.reduce).Sum(v);
  if (threadIdx.x == 0) sm.bcast_u64[0] = s;
  __syncthreads();
  const unsigned long long r = sm.bcast_u64[0];
  __syncthreads();
  return r;
}

__device__ unsigned long long block_max(Smem& sm, unsigned long long v) {
  const unsigned long long s =
      cub::BlockReduce<unsigned long long, kThreads>(sm.tmp.reduce).Reduce(v, [](auto a, auto b) { return a > b ? a : b; });
  if (threadIdx.x == 0) sm.bcast_u64[0] = s;
  __syncthreads();
  const unsigned long long r = sm.bcast_u64[0];
  __syncthreads();
  return r;
}

// (key desc, id asc) as one u64 for a max reduction.
__device__ __forceinline__ unsigned long long pack_rank(uint32_t key, int i) {
  return (static_cast<unsigned long long>(key) << 32) | (0xFFFFFFFFu - uint32_t(i));
}
__device__ __forceinline__ int unpack_id(unsigned long long p) { return int(0xFFFFFFFFu - uint32_t(p)); }

// The rank-`need` position of the order (count mode: weight 1 per key; mass mode: the
// fixed-point weight), among keys >= restrict_min. Returns v with weight(> v) < need <=
// weight(>= v), the count of keys > v, and (mass mode) the weight of keys > v.
template <bool kMass>
__device__ void radix_select(Smem& sm, const RowX& xf, int vocab, float m, uint32_t restrict_min, uint64_t need,
                             uint32_t& v_out, uint64_t& count_gt, uint64_t& weight_gt, uint32_t& eq_total) {
  uint32_t prefix = 0, mask = 0;
  count_gt = 0;
  weight_gt = 0;
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass];
    const uint32_t dmask = (1u << kBits[pass]) - 1u;
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sm.hist_c[b] = 0;
      if (kMass) sm.hist_w[b] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = xf(i);
      const uint32_t key = float_order_key(x);
      if (key < restrict_min || (key & mask) != prefix) continue;
      const int d = int((key >> shift) & dmask);
      atomicAdd(&sm.hist_c[d], 1u);
      if (kMass) {
        const uint64_t w = mass_weight(x, m);
        if (w) atomicAdd(&sm.hist_w[d], static_cast<unsigned long long>(w));
      }
    }
    __syncthreads();
    // Walk the bins from the highest digit down: thread t owns bins kBins-1-(t*4+j).
    unsigned long long local_w = 0, local_c = 0;
    for (int j = 0; j < kBinsPerThread; ++j) {
      const int d = kBins - 1 - (threadIdx.x * kBinsPerThread + j);
      local_c += sm.hist_c[d];
      if (kMass) local_w += sm.hist_w[d];
    }
    unsigned long long above_c, above_w = 0;
    cub::BlockScan<unsigned long long, kThreads>(sm.tmp.scan_u64).ExclusiveSum(local_c, above_c);
    __syncthreads();
    if (kMass) cub::BlockScan<unsigned long long, kThreads>(sm.tmp.scan_u64).ExclusiveSum(local_w, above_w);
    unsigned long long acc_c = above_c, acc_w = above_w;
    for (int j = 0; j < kBinsPerThread; ++j) {
      const int d = kBins - 1 - (threadIdx.x * kBinsPerThread + j);
      const unsigned long long hc = sm.hist_c[d];
      const unsigned long long h = kMass ? sm.hist_w[d] : hc;
      const unsigned long long acc = kMass ? acc_w : acc_c;
      if (acc < need && acc + h >= need) {
        sm.bcast_u32[0] = uint32_t(d);
        sm.bcast_u32[1] = uint32_t(hc);
        sm.bcast_u64[1] = acc_c;
        sm.bcast_u64[2] = acc_w;
      }
      acc_c += hc;
      acc_w += kMass ? sm.hist_w[d] : 0;
    }
    __syncthreads();
    const uint32_t d = sm.bcast_u32[0];
    prefix |= d << shift;
    mask |= dmask << shift;
    count_gt += sm.bcast_u64[1];
    weight_gt += sm.bcast_u64[2];
    need -= kMass ? sm.bcast_u64[2] : sm.bcast_u64[1];
    eq_total = sm.bcast_u32[1];
    __syncthreads();
  }
  v_out = prefix;
}

// fn(i, x, key, eq_rank) for every key >= v, where eq_rank (valid when key == v) is the id
// rank among the keys equal to v. Strided (eq_rank 0) unless `ordered`.
template <class Fn>
__device__ void for_each_at_least(Smem& sm, const RowX& xf, int vocab, uint32_t v, bool ordered, Fn&& fn) {
  if (!ordered) {
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = xf(i);
      const uint32_t key = float_order_key(x);
      if (key >= v) fn(i, x, key, 0u);
    }
    return;
  }
  uint32_t base = 0;
  for (int i0 = 0; i0 < vocab; i0 += kThreads) {
    const int i = i0 + threadIdx.x;
    float x = 0.0f;
    uint32_t key = 0;
    if (i < vocab) {
      x = xf(i);
      key = float_order_key(x);
    }
    const int eq = i < vocab && key == v;
    int rank, total;
    cub::BlockScan<int, kThreads>(sm.tmp.scan_int).ExclusiveSum(eq, rank, total);
    if (i < vocab && key >= v) fn(i, x, key, base + uint32_t(rank));
    base += uint32_t(total);
    __syncthreads();
  }
}

__device__ __forceinline__ bool in_prefix(const Prefix& p, uint32_t key, uint32_t eq_rank) {
  return key > p.v || (key == p.v && eq_rank < p.e);
}

__device__ void apply_penalties(const SampleArgs& a, const SamplingRowParams& P, float* l, uint32_t* bits, int64_t words,
                                int row) {
  const int32_t* hist = a.history + row * a.history_stride;
  const int np = a.prompt_len[row], no = a.output_len[row];
  uint32_t* seen = bits;
  uint32_t* first = bits + words;
  for (int64_t w = threadIdx.x; w < 2 * words; w += kThreads) bits[w] = 0;
  __syncthreads();
  if (P.repetition_penalty != 1.0f) {
    for (int j = threadIdx.x; j < np + no; j += kThreads) {
      const int32_t t = hist[j];
      if (t < 0 || t >= a.vocab) continue;
      const uint32_t bit = 1u << (t & 31);
      if (atomicOr(&seen[t >> 5], bit) & bit) continue;
      const float v = l[t];
      l[t] = v > 0.0f ? __fdiv_rn(v, P.repetition_penalty) : __fmul_rn(v, P.repetition_penalty);
    }
    __syncthreads();
  }
  if (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f) {
    const int32_t* out = hist + np;
    for (int j = threadIdx.x; j < no; j += kThreads) {
      const int32_t t = out[j];
      if (t < 0 || t >= a.vocab) continue;
      const uint32_t bit = 1u << (t & 31);
      if (atomicOr(&first[t >> 5], bit) & bit) continue;
      int n = 0;
      for (int q = 0; q < no; ++q) n += out[q] == t;
      const float pen = __fadd_rn(P.presence_penalty, __fmul_rn(P.frequency_penalty, float(n)));
      l[t] = __fsub_rn(l[t], pen);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a, uint32_t* bitmaps, int64_t bitmap_words) {
  __shared__ Smem sm;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  float* l = a.logits + row * a.logits_stride;
  auto write_empty_top = [&](int from) {
    if (a.top_ids)
      for (int j = from + tid; j < kMaxTopLogprobs; j += kThreads) {
        a.top_ids[row * kMaxTopLogprobs + j] = kNoToken;
        a.top_logprobs[row * kMaxTopLogprobs + j] = 0.0f;
      }
  };
  if (a.done && a.done[row]) {
    if (tid == 0) {
      a.tokens[row] = kNoToken;
      if (a.logprob) a.logprob[row] = 0.0f;
    }
    write_empty_top(0);
    return;
  }
  const SamplingRowParams P = a.params[row];
  if (a.history && (P.repetition_penalty != 1.0f || P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f))
    apply_penalties(a, P, l, bitmaps + row * 2 * bitmap_words, bitmap_words, row);
  const bool greedy = P.temperature == 0.0f;
  const RowX xf{l, P.temperature, !greedy};
  const int V = a.vocab;

  // max (greedy argmax)
  unsigned long long best = 0;
  for (int i = tid; i < V; i += kThreads) {
    const unsigned long long r = pack_rank(float_order_key(xf(i)), i);
    best = r > best ? r : best;
  }
  best = block_max(sm, best);
  const int argmax = unpack_id(best);
  const float m = xf(argmax);

  const bool want_lp = P.logprobs_top_n >= 0;
  const bool top_k_on = !greedy && P.top_k > 0 && P.top_k < V;
  const bool top_p_on = !greedy && P.top_p < 1.0f;
  Prefix pk;  // the top-k prefix (all when off)
  pk.n = uint64_t(V);
  if (top_k_on) {
    uint64_t cgt, wgt;
    radix_select<false>(sm, xf, V, m, 0u, uint64_t(P.top_k), pk.v, cgt, wgt, pk.eq_total);
    pk.e = uint32_t(uint64_t(P.top_k) - cgt);
    pk.n = uint64_t(P.top_k);
  }
  // Masses: Σ over all (logprobs, top-p without top-k) and Σ above the top-k cut.
  uint64_t z_all = 0, z_k = 0;
  if (want_lp || top_p_on) {
    unsigned long long s_all = 0, s_gt = 0;
    for (int i = tid; i < V; i += kThreads) {
      const float x = xf(i);
      const uint64_t w = mass_weight(x, m);
      s_all += w;
      if (float_order_key(x) > pk.v) s_gt += w;
    }
    z_all = block_sum(sm, s_all);
    if (top_k_on) {
      const uint64_t gt = block_sum(sm, s_gt);
      z_k = gt + uint64_t(pk.e) * mass_weight(cpu::float_from_order_key(pk.v), m);
    } else {
      z_k = z_all;
    }
  }
  Prefix cut = pk;
  if (top_p_on) {
    const double t = ceil(double(P.top_p) * double(z_k));
    const uint64_t t_int = uint64_t(t);
    const uint64_t target = t_int < z_k ? t_int : z_k;
    Prefix pp;
    uint64_t cgt, wgt;
    radix_select<true>(sm, xf, V, m, top_k_on ? pk.v : 0u, target, pp.v, cgt, wgt, pp.eq_total);
    const uint64_t w_eq = mass_weight(cpu::float_from_order_key(pp.v), m);
    const uint64_t c = w_eq ? (target - wgt + w_eq - 1) / w_eq : 1;
    pp.e = uint32_t(c);
    pp.n = cgt + c;
    if (pp.n < cut.n) cut = pp;
  }
  const bool min_p_on = !greedy && P.min_p > 0.0f;
  const float min_cut = min_p_on ? m + logf(P.min_p) : 0.0f;

  int token = argmax;
  if (!greedy) {
    const bool ordered = cut.e != kAllKept && cut.e < cut.eq_total;
    const uint64_t seed = P.seed;
    const uint64_t step = a.draw_index ? uint64_t(uint32_t(a.draw_index[row])) : 0;
    unsigned long long win = 0;
    for_each_at_least(sm, xf, V, (top_k_on || top_p_on) ? cut.v : 0u, ordered,
                      [&](int i, float x, uint32_t key, uint32_t eq_rank) {
                        if ((top_k_on || top_p_on) && !in_prefix(cut, key, ordered ? eq_rank : 0u)) return;
                        if (min_p_on && !(x >= min_cut)) return;
                        const float u = cpu::bits_to_open_uniform(cpu::sample_bits(seed, step, uint32_t(i)));
                        const float e = -logf(u);
                        const float g = x - logf(e);
                        const unsigned long long r = pack_rank(float_order_key(g), i);
                        win = r > win ? r : win;
                      });
    win = block_max(sm, win);
    token = unpack_id(win);
  }
  if (tid == 0) a.tokens[row] = token;
  if (!want_lp) {
    if (tid == 0 && a.logprob) a.logprob[row] = 0.0f;
    write_empty_top(0);
    return;
  }
  const double lse = double(m) + log(double(z_all) / kMassOne);
  if (tid == 0 && a.logprob) a.logprob[row] = float(double(xf(token)) - lse);
  const int n = P.logprobs_top_n < V ? P.logprobs_top_n : V;
  if (n > 0 && a.top_ids) {
    Prefix pn;
    uint64_t cgt, wgt;
    radix_select<false>(sm, xf, V, m, 0u, uint64_t(n), pn.v, cgt, wgt, pn.eq_total);
    pn.e = uint32_t(uint64_t(n) - cgt);
    if (tid == 0) sm.top_n = 0;
    __syncthreads();
    const bool ordered = pn.e < pn.eq_total;
    for_each_at_least(sm, xf, V, pn.v, ordered, [&](int i, float, uint32_t key, uint32_t eq_rank) {
      if (!in_prefix(pn, key, ordered ? eq_rank : 0u)) return;
      const int slot = atomicAdd(&sm.top_n, 1);
      if (slot < kMaxTopLogprobs) {
        sm.top_id[slot] = i;
        sm.top_key[slot] = key;
      }
    });
    __syncthreads();
    if (tid == 0) {  // <= 20 entries: insertion sort by (key desc, id asc)
      const int c = sm.top_n < n ? sm.top_n : n;
      for (int q = 1; q < c; ++q)
        for (int r = q; r > 0; --r) {
          const bool before = sm.top_key[r] > sm.top_key[r - 1] ||
                              (sm.top_key[r] == sm.top_key[r - 1] && sm.top_id[r] < sm.top_id[r - 1]);
          if (!before) break;
          const int ti = sm.top_id[r];
          const uint32_t tk = sm.top_key[r];
          sm.top_id[r] = sm.top_id[r - 1];
          sm.top_key[r] = sm.top_key[r - 1];
          sm.top_id[r - 1] = ti;
          sm.top_key[r - 1] = tk;
        }
      for (int q = 0; q < c; ++q) {
        a.top_ids[row * kMaxTopLogprobs + q] = sm.top_id[q];
        a.top_logprobs[row * kMaxTopLogprobs + q] = float(double(xf(sm.top_id[q])) - lse);
      }
    }
    write_empty_top(n);
  } else {
    write_empty_top(0);
  }
}

}  // namespace

void sample(const SampleArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check_sample_args(a, workspace_bytes);
  if (a.rows == 0) return;
  const int64_t words = (int64_t(a.vocab) + 31) / 32;
  sample_kernel<<<a.rows, kThreads, 0, stream>>>(a, static_cast<uint32_t*>(workspace), words);
  FP4MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4moe::cuda::sampling
