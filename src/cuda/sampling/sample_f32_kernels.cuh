// The kernels of sample() (sample_f32.cu launches them; tests/ops/sampling_emu_test runs them in
// the CUDA emulator against cpu::sample_cpu), their geometry and workspace layout.
// F32 logits [rows, vocab] -> one token per row (core/sampling_scheme.hpp's scheme), in
// three launches; a row is split into `chunks` CTAs when the rows are few (geometry()).
//
//   stats   (chunks x rows)  penalties of the chunk's tokens (in place), the chunk's max (greedy
//                            argmax) and, for a plain temperature row (no top-k / top-p / min-p),
//                            its Gumbel winner: the draw of such a row is this one read.
//   mass    (chunks x rows)  rows that truncate or want logprobs: Σ of fixed-point weights and a
//                            row histogram of 2048 bins of (max − x) · 64 (count, weight), by
//                            integer atomics (order-free, so deterministic).
//   finish  (chunks x rows)  each CTA reads the row histogram and finds bin B such that bins
//                            <= B hold the kept prefix, the top-k prefix and the top-n (a rank
//                            prefix: the bin is monotone in x). If they are <= kCandCap tokens the
//                            chunks gather them into the row's candidate list and the last CTA of
//                            the row selects and draws over them in shared memory (the radix
//                            passes run over a few thousand candidates, not the row); otherwise
//                            (flat rows, huge top-k, non-finite max) one CTA runs the same
//                            selection over the whole row. Plain and greedy rows need no list.
//
// Reads of the row: greedy and plain temperature 1 (the draw: Philox once per 4 tokens, and a
// token whose x + 17 is below the running best Gumbel key skips its draw, exactly: −log(−log u)
// <= 16.7 for the scheme's u); truncation / logprobs 3 (stats, mass, gather), plus the
// whole-row radix passes for a row whose candidates overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/sampling/sample_select.cuh"  // first: device_prims.cuh (the emulator under FP4MOE_CUDA_EMU)

namespace fp4moe::cuda::sampling {
namespace {

using namespace detail;

constexpr int kMaxChunks = 128;
constexpr int kMinChunk = 1024;      // tokens per chunk at least
constexpr int kChunkAlign = 128;     // chunk starts: multiples of 4 (Philox groups, float4) and 32 (bitmap words)
constexpr int kTargetCtas = 1024;    // split rows until about this many CTAs
constexpr int kRowBins = 2048;       // row histogram bins of (max − x) · kBinsPerUnit
constexpr float kBinsPerUnit = 64.0f;
using cpu::kGumbelBound;  // > max of −log(−log u), u <= 1 − 2^−24

struct Geometry {
  int chunks = 1;
  int chunk_len = 0;
};

Geometry geometry(int rows, int vocab) {
  Geometry g;
  int c = kTargetCtas / (rows > 0 ? rows : 1);
  c = std::min(c, kMaxChunks);
  c = std::min(c, vocab / kMinChunk);
  c = std::max(c, 1);
  g.chunk_len = ((vocab + c - 1) / c + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  g.chunks = (vocab + g.chunk_len - 1) / g.chunk_len;
  return g;
}

struct Partial {
  unsigned long long max_rank;  // pack_rank of the chunk's max x
  unsigned long long win_rank;  // pack_rank of the chunk's Gumbel winner (plain rows)
  unsigned long long z;         // Σ fixed-point weights of the chunk (mass rows)
};

struct Workspace {  // per row r: element r * (per-row size) of each array
  unsigned long long* hist_w;   // [rows, kRowBins]
  Partial* partials;            // [rows, kMaxChunks]
  uint32_t* hist_c;             // [rows, kRowBins]
  uint32_t* counters;           // [rows, 2]: CTAs of finish done, candidates gathered
  int32_t* cand_id;             // [rows, kCandCap]
  float* cand_x;                // [rows, kCandCap]
  uint32_t* bitmaps;            // [rows, 2, words]
  int64_t words;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Carves the workspace; with base null only counts the bytes.
Workspace carve(void* base, int64_t rows, int64_t vocab, size_t* bytes) {
  Workspace w{};
  w.words = (vocab + 31) / 32;
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) {
    char* at = p ? p + off : nullptr;
    off += align256(n);
    return at;
  };
  const size_t R = size_t(rows);
  w.hist_w = reinterpret_cast<unsigned long long*>(take(R * kRowBins * 8));
  w.partials = reinterpret_cast<Partial*>(take(R * kMaxChunks * sizeof(Partial)));
  w.hist_c = reinterpret_cast<uint32_t*>(take(R * kRowBins * 4));
  w.counters = reinterpret_cast<uint32_t*>(take(R * 2 * 4));
  w.cand_id = reinterpret_cast<int32_t*>(take(R * kCandCap * 4));
  w.cand_x = reinterpret_cast<float*>(take(R * kCandCap * 4));
  w.bitmaps = reinterpret_cast<uint32_t*>(take(R * 2 * size_t(w.words) * 4));
  if (bytes) *bytes = off;
  return w;
}

// The row-histogram bin of x: floor((m − x) · 64), NaN and far tails in the last bin. Monotone:
// a larger x never gets a larger bin, so "bin <= B" is a prefix of the rank order.
__device__ __forceinline__ int row_bin(float x, float m) {
  const float d = (m - x) * kBinsPerUnit;
  return d < float(kRowBins - 1) ? int(d) : kRowBins - 1;  // NaN fails the test
}

// Four consecutive tokens i0..i0+3 (those < V), float4 when the row allows it.
__device__ __forceinline__ int load4(const float* l, int i0, int V, bool vec, float (&v)[4]) {
  if (vec && i0 + 3 < V) {
    const float4 q = *reinterpret_cast<const float4*>(l + i0);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return 4;
  }
  int n = 0;
  for (int j = 0; j < 4; ++j)
    if (i0 + j < V) v[n++] = l[i0 + j];
  return n;
}

// Penalties of the tokens in [i0, i1), in place, once per distinct token (bitmap words of the
// chunk: only this CTA touches them). Each chunk reads the whole token list.
__device__ void apply_penalties(const SampleArgs& a, const SamplingParams& P, float* l, uint32_t* bits,
                                int64_t words, int row, int i0, int i1) {
  const int32_t* hist = a.history + row * a.history_stride;
  const int np = a.prompt_len[row], no = a.output_len[row];
  uint32_t* seen = bits;
  uint32_t* first = bits + words;
  for (int w = i0 / 32 + int(threadIdx.x); w < (i1 + 31) / 32; w += kThreads) seen[w] = first[w] = 0;
  __syncthreads();
  if (P.repetition_penalty != 1.0f) {
    for (int j = threadIdx.x; j < np + no; j += kThreads) {
      const int32_t t = hist[j];
      if (t < i0 || t >= i1) continue;
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
      if (t < i0 || t >= i1) continue;
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

__device__ __forceinline__ bool row_done(const SampleArgs& a, int row) { return a.done && a.done[row]; }

__global__ void __launch_bounds__(kThreads) stats_kernel(SampleArgs a, Workspace ws, Geometry g, bool vec) {
  __shared__ Common cm;
  const int row = blockIdx.y, c = blockIdx.x, tid = threadIdx.x;
  if (row_done(a, row)) return;
  const int V = a.vocab;
  const int i0 = c * g.chunk_len, i1 = min(V, i0 + g.chunk_len);
  float* l = a.logits + row * a.logits_stride;
  const SamplingParams& P = a.params[row];  // by reference: a copy of the 48 B costs 16 registers here (64 vs 48)
  const RowFlags f(P, V);
  if (f.needs_mass()) {  // clear this chunk's share of the row's histogram and counters
    for (int b = c * kThreads + tid; b < kRowBins; b += g.chunks * kThreads) {
      ws.hist_c[size_t(row) * kRowBins + b] = 0;
      ws.hist_w[size_t(row) * kRowBins + b] = 0;
    }
    if (c == 0 && tid < 2) ws.counters[row * 2 + tid] = 0;
  }
  if (a.history && (P.repetition_penalty != 1.0f || P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f))
    apply_penalties(a, P, l, ws.bitmaps + size_t(row) * 2 * size_t(ws.words), ws.words, row, i0, i1);
  const bool scale = !f.greedy, plain = f.plain();
  const float t = P.temperature;
  const uint64_t seed = P.seed;
  const uint64_t step = a.draw_index ? uint64_t(uint32_t(a.draw_index[row])) : 0;
  unsigned long long best = 0, win = 0;
  float win_g = -INFINITY;
  for (int i4 = i0 + 4 * tid; i4 < i1; i4 += 4 * kThreads) {
    float v[4];
    const int n = load4(l, i4, V, vec, v);
    bool draw = false;
    for (int j = 0; j < n; ++j) {
      const float x = scale ? __fdiv_rn(v[j], t) : v[j];
      v[j] = x;
      const unsigned long long r = pack_rank(float_order_key(x), i4 + j);
      best = r > best ? r : best;
      draw |= !(x + kGumbelBound < win_g);
    }
    if (!plain || !draw) continue;
    const cpu::Philox4 bits = cpu::philox4x32_10(uint32_t(i4) >> 2, uint32_t(step), uint32_t(step >> 32), 0x53414D50u,
                                                 uint32_t(seed), uint32_t(seed >> 32));
    for (int j = 0; j < n; ++j) {
      if (v[j] + kGumbelBound < win_g) continue;  // its key cannot reach the best one
      const float gk = cpu::gumbel_key(v[j], bits.v[j]);
      const unsigned long long r = pack_rank(float_order_key(gk), i4 + j);
      if (r > win) {
        win = r;
        win_g = gk;
      }
    }
  }
  best = block_max(cm, best);
  if (plain) win = block_max(cm, win);
  if (tid == 0) {
    Partial& p = ws.partials[size_t(row) * kMaxChunks + c];
    p.max_rank = best;
    p.win_rank = win;
  }
}

// The row's max rank (and the plain row's winner) over its chunks' partials.
__device__ void reduce_partials(Common& cm, const Workspace& ws, int row, int chunks, unsigned long long& best,
                                unsigned long long& win) {
  unsigned long long b = 0, w = 0;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const Partial& p = ws.partials[size_t(row) * kMaxChunks + c];
    b = p.max_rank > b ? p.max_rank : b;
    w = p.win_rank > w ? p.win_rank : w;
  }
  best = block_max(cm, b);
  win = block_max(cm, w);
}

__global__ void __launch_bounds__(kThreads) mass_kernel(SampleArgs a, Workspace ws, Geometry g, bool vec) {
  __shared__ Common cm;
  __shared__ unsigned long long hw[kRowBins];
  __shared__ uint32_t hc[kRowBins];
  const int row = blockIdx.y, c = blockIdx.x, tid = threadIdx.x;
  if (row_done(a, row)) return;
  const int V = a.vocab;
  const SamplingParams P = a.params[row];
  const RowFlags f(P, V);
  if (!f.needs_mass()) return;
  const int i0 = c * g.chunk_len, i1 = min(V, i0 + g.chunk_len);
  const float* l = a.logits + row * a.logits_stride;
  const RowSrc rx{l, P.temperature, !f.greedy, V};
  for (int b = tid; b < kRowBins; b += kThreads) hw[b] = 0, hc[b] = 0;
  unsigned long long best, win;
  reduce_partials(cm, ws, row, g.chunks, best, win);  // also orders the clearing above
  const float m = rx.x(unpack_id(best));
  unsigned long long z = 0;
  for (int i4 = i0 + 4 * tid; i4 < i1; i4 += 4 * kThreads) {
    float v[4];
    const int n = load4(l, i4, V, vec, v);
    for (int j = 0; j < n; ++j) {
      const float x = rx.scale ? __fdiv_rn(v[j], rx.t) : v[j];
      const uint64_t w = mass_weight(x, m);
      z += w;
      const int b = row_bin(x, m);
      atomicAdd(&hc[b], 1u);
      if (w) atomicAdd(&hw[b], static_cast<unsigned long long>(w));
    }
  }
  z = block_sum(cm, z);  // syncs: the shared histogram is complete
  for (int b = tid; b < kRowBins; b += kThreads) {
    if (hc[b]) atomicAdd(&ws.hist_c[size_t(row) * kRowBins + b], hc[b]);
    if (hw[b]) atomicAdd(&ws.hist_w[size_t(row) * kRowBins + b], hw[b]);
  }
  if (tid == 0) ws.partials[size_t(row) * kMaxChunks + c].z = z;
}

struct FinishSmem {
  Common cm;
  union {
    Hist<11> full;  // whole-row selection
    struct {
      Hist<9> hist;
      int32_t id[kCandCap];
      float x[kCandCap];
    } cand;
  } u;
};

// The first bin whose cumulative value (bins ascending) reaches `need`; thread t holds the
// exclusive prefix `ex` and its kPer bins `vals`.
template <int kPer>
__device__ int first_bin_reaching(Common& cm, const unsigned long long (&vals)[kPer], unsigned long long ex,
                                  unsigned long long need) {
  if (threadIdx.x == 0) cm.bcast_u32[0] = kRowBins - 1;
  __syncthreads();
  unsigned long long acc = ex;
  for (int j = 0; j < kPer; ++j) {
    if (acc < need && acc + vals[j] >= need) cm.bcast_u32[0] = uint32_t(threadIdx.x * kPer + j);
    acc += vals[j];
  }
  __syncthreads();
  const int b = int(cm.bcast_u32[0]);
  __syncthreads();
  return b;
}

enum class Plan { kDirect, kGather, kWholeRow };

__global__ void __launch_bounds__(kThreads) finish_kernel(SampleArgs a, Workspace ws, Geometry g, bool vec) {
  __shared__ FinishSmem sm;
  Common& cm = sm.cm;
  const int row = blockIdx.y, c = blockIdx.x, tid = threadIdx.x;
  if (row_done(a, row)) {
    if (c != 0) return;
    if (tid == 0) {
      a.tokens[row] = kNoToken;
      if (a.logprob) a.logprob[row] = 0.0f;
    }
    write_empty_top(a, row, 0);
    return;
  }
  const int V = a.vocab;
  const SamplingParams P = a.params[row];
  const RowFlags f(P, V);
  const float* l = a.logits + row * a.logits_stride;
  const RowSrc rx{l, P.temperature, !f.greedy, V};
  unsigned long long best, win;
  reduce_partials(cm, ws, row, g.chunks, best, win);
  const int argmax = unpack_id(best);
  const float m = rx.x(argmax);
  const int n_top = a.top_ids && P.logprobs_top_n > 0 ? (P.logprobs_top_n < V ? P.logprobs_top_n : V) : 0;
  Plan plan = Plan::kDirect;
  uint64_t z_all = 0;
  int B = -1;  // candidates: bins <= B
  if (f.needs_mass()) {
    constexpr int kPer = kRowBins / kThreads;
    unsigned long long cnt[kPer], wts[kPer], lc = 0, lw = 0;
    for (int j = 0; j < kPer; ++j) {
      const size_t at = size_t(row) * kRowBins + size_t(tid * kPer + j);
      cnt[j] = ws.hist_c[at];
      wts[j] = ws.hist_w[at];
      lc += cnt[j];
      lw += wts[j];
    }
    unsigned long long tot;
    const unsigned long long ex_c = block_exclusive_sum(cm, lc, tot);
    const unsigned long long ex_w = block_exclusive_sum(cm, lw, tot);
    unsigned long long zs = 0;
    for (int q = tid; q < g.chunks; q += kThreads) zs += ws.partials[size_t(row) * kMaxChunks + q].z;
    z_all = block_sum(cm, zs);
    if (f.truncates()) {
      if (f.top_k_on) {
        B = first_bin_reaching(cm, cnt, ex_c, uint64_t(P.top_k));
      } else if (f.top_p_on) {
        const double t = ceil(double(P.top_p) * double(z_all));
        const uint64_t t_int = uint64_t(t);
        B = first_bin_reaching(cm, wts, ex_w, t_int < z_all ? t_int : z_all);
      } else {
        B = row_bin(m + logf(P.min_p), m);
      }
    }
    if (n_top > 0) B = max(B, first_bin_reaching(cm, cnt, ex_c, uint64_t(n_top)));
    if (B >= 0) {
      if (tid == 0) cm.bcast_u64[1] = 0;
      __syncthreads();
      unsigned long long acc = ex_c;
      for (int j = 0; j < kPer; ++j) {
        acc += cnt[j];
        if (tid * kPer + j == B) cm.bcast_u64[1] = acc;
      }
      __syncthreads();
      const unsigned long long count = cm.bcast_u64[1];
      const bool finite = isfinite(m);
      plan = finite && count <= kCandCap ? Plan::kGather : Plan::kWholeRow;
      __syncthreads();
    }
    if (!isfinite(m)) plan = Plan::kWholeRow;
  }
  const int plain_token = unpack_id(win);
  if (plan != Plan::kGather) {
    if (c != 0) return;
    finish_row(cm, sm.u.full, rx, rx, a, P, row, m, argmax, plain_token, z_all);
    return;
  }
  // Gather this chunk's candidates (bins <= B) into the row's list.
  const int i0 = c * g.chunk_len, i1 = min(V, i0 + g.chunk_len);
  if (tid == 0) cm.top_n = 0;
  __syncthreads();
  for (int i4 = i0 + 4 * tid; i4 < i1; i4 += 4 * kThreads) {
    float v[4];
    const int n = load4(l, i4, V, vec, v);
    for (int j = 0; j < n; ++j) {
      const float x = rx.scale ? __fdiv_rn(v[j], rx.t) : v[j];
      if (row_bin(x, m) > B) continue;
      const int slot = atomicAdd(&cm.top_n, 1);
      sm.u.cand.id[slot] = i4 + j;
      sm.u.cand.x[slot] = x;
    }
  }
  __syncthreads();
  const int n_local = cm.top_n;
  if (tid == 0) cm.flag = int(atomicAdd(&ws.counters[row * 2 + 1], uint32_t(n_local)));
  __syncthreads();
  const int base = cm.flag;
  int32_t* gid = ws.cand_id + size_t(row) * kCandCap;
  float* gx = ws.cand_x + size_t(row) * kCandCap;
  for (int j = tid; j < n_local; j += kThreads) {
    gid[base + j] = sm.u.cand.id[j];
    gx[base + j] = sm.u.cand.x[j];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) cm.flag = atomicAdd(&ws.counters[row * 2], 1u) == uint32_t(g.chunks - 1);
  __syncthreads();
  if (!cm.flag) return;
  __threadfence();
  const int total = int(__ldcg(&ws.counters[row * 2 + 1]));
  for (int j = tid; j < total; j += kThreads) {
    sm.u.cand.id[j] = __ldcg(gid + j);
    sm.u.cand.x[j] = __ldcg(gx + j);
  }
  __syncthreads();
  const CandSrc src{sm.u.cand.id, sm.u.cand.x, total};
  finish_row(cm, sm.u.cand.hist, src, rx, a, P, row, m, argmax, plain_token, z_all);
}

}  // namespace
}  // namespace fp4moe::cuda::sampling
