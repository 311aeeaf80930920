// Scoring + grouped top-k + top-k + weights of ONE token by ONE warp (device code, header
// only; shared by the fused GEMV path and the tiled path's selection kernel).
//
// Lane l holds experts e = l + 32 j (j < kPerLane, E <= 32 kPerLane) in registers. The
// arithmetic follows cpu/moe_cpu.cpp route_token step by step so that, on the same FP32
// logits, the ids are identical and the weights equal to the last bit or so:
//   sigmoid: 1 / (1 + exp(-l)), exp correctly rounded (exp_f32_rn)
//   softmax: exp(l - max) * float(1 / Σ_double exp(l - max))
//   sel = score + bias (NaN -> -inf); group score = best two sel of the group
//   ranking: higher first, equal -> lower id (experts and groups); taken slots in rank order
//   weights: score * float(1 / (Σ_double score + 1e-20)) * routed_scaling (or score * 1 * scaling)
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "cuda/routing/router.hpp"

namespace fp4moe::cuda::router_detail {

// exp of a float, correctly rounded to float (via double; double rounding is ~2^-29 rare):
// agrees with the CPU's std::exp(float) far more often than expf's 2-ulp result, so the
// scores, and therefore the near-tie order, match route_cpu on the same logits.
__device__ __forceinline__ float exp_f32_rn(float v) { return float(exp(double(v))); }

// Floats of per-warp shared scratch select_token_warp needs (used when n_group > 1).
__host__ __device__ constexpr int select_scratch_floats(int num_experts) { return num_experts + kMaxRouterGroups; }

__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
  return va > vb || (va == vb && a < b);
}

// logit(e) returns expert e's FP32 logit (it is called once per expert, e < E).
// scratch: this warp's select_scratch_floats(E) floats of shared memory.
template <int kPerLane, class LogitFn>
__device__ void select_token_warp(const RouterDesc& d, LogitFn&& logit, const float* __restrict__ bias,
                                  float* scratch, int32_t* __restrict__ ids, float* __restrict__ wts) {
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = int(threadIdx.x & 31);
  const int E = d.num_experts;
  float score[kPerLane], sel[kPerLane];  // (kPerLane) experts lane + 32 j
  uint32_t avail = 0;                    // bit j: expert lane + 32 j exists and is eligible
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    score[j] = e < E ? logit(e) : 0.0f;
    if (e < E) avail |= 1u << j;
  }

  if (d.scoring == ScoringFunc::Softmax) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (avail >> j & 1) mx = fmaxf(mx, score[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    double sum = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (avail >> j & 1) {
        score[j] = exp_f32_rn(score[j] - mx);
        sum += double(score[j]);
      }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
    const float inv = float(1.0 / sum);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) score[j] *= inv;
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) score[j] = 1.0f / (1.0f + exp_f32_rn(-score[j]));
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    const float s = score[j] + ((bias && e < E) ? __ldg(bias + e) : 0.0f);
    sel[j] = isnan(s) ? -INFINITY : s;  // NaN never wins
  }

  // Grouped top-k: a group's score is the sum of its best two sel; the best topk_group
  // groups stay eligible.
  if (d.n_group > 1) {
    const int ng = d.n_group, G = E / ng;
    float* gscore = scratch + E;  // [ng]
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (avail >> j & 1) scratch[lane + 32 * j] = sel[j];
    __syncwarp();
    for (int g = lane; g < ng; g += 32) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < G; ++i) {
        const float v = scratch[g * G + i];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      const float gs = G >= 2 ? b1 + b2 : b1;
      gscore[g] = isnan(gs) ? -INFINITY : gs;
    }
    __syncwarp();
    bool ok_lo = false, ok_hi = false;  // groups lane and lane + 32
    if (lane < ng) {
      int rank = 0;
      for (int h = 0; h < ng; ++h) rank += ranks_before(gscore[h], h, gscore[lane], lane);
      ok_lo = rank < d.topk_group;
    }
    if (lane + 32 < ng) {
      int rank = 0;
      for (int h = 0; h < ng; ++h) rank += ranks_before(gscore[h], h, gscore[lane + 32], lane + 32);
      ok_hi = rank < d.topk_group;
    }
    const uint64_t ok = uint64_t(__ballot_sync(kFull, ok_lo)) | (uint64_t(__ballot_sync(kFull, ok_hi)) << 32);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if ((avail >> j & 1) && !(ok >> ((lane + 32 * j) / G) & 1)) avail &= ~(1u << j);
    __syncwarp();  // scratch is free for the next token
  }

  // Top-k: k rounds of a warp arg-max over (sel, id); only the winner's lane rescans.
  float best_v = -INFINITY;
  int best_e = INT_MAX;  // INT_MAX: this lane has no candidate left
  auto rescan = [&] {
    best_v = -INFINITY;
    best_e = INT_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if ((avail >> j & 1) && (best_e == INT_MAX || sel[j] > best_v)) {
        best_v = sel[j];
        best_e = lane + 32 * j;
      }
  };
  rescan();
  float my_score = 0.0f;  // lane s < k: slot s
  int my_id = 0;
  for (int s = 0; s < d.top_k; ++s) {
    float v = best_v;
    int id = best_e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, v, o);
      const int oid = __shfl_xor_sync(kFull, id, o);
      if (ranks_before(ov, oid, v, id)) {
        v = ov;
        id = oid;
      }
    }
    if (id == INT_MAX) id = 0;  // unreachable: check_router_desc guarantees k eligible experts
    const int owner = id & 31;
    float sc = 0.0f;
    if (lane == owner) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        if (j == (id >> 5)) {
          sc = score[j];
          avail &= ~(1u << j);
        }
      rescan();
    }
    sc = __shfl_sync(kFull, sc, owner);
    if (lane == s) {
      my_id = id;
      my_score = sc;
    }
  }
  double sum = 0;
  for (int s = 0; s < d.top_k; ++s) sum += double(__shfl_sync(kFull, my_score, s));
  const float norm = d.norm_topk_prob ? float(1.0 / (sum + 1e-20)) : 1.0f;
  if (lane < d.top_k) {
    ids[lane] = my_id;
    wts[lane] = my_score * norm * d.routed_scaling;
  }
}

}  // namespace fp4moe::cuda::router_detail
