// Device helpers of the permutation: which expert and weight a pair (token, slot) has.
// Pair p = t*R + slot, R = top_k + extra: slots < top_k are routed (topk_ids/weights),
// slots top_k + j are the always-selected expert E + j with weight exactly 1.
#pragma once

#include <cstdint>

namespace fp4moe::cuda {

struct PairSource {
  const int32_t* ids;    // [T, k]
  const float* weights;  // [T, k]
  int top_k, rows_per_token, num_experts;  // k, R = k + X, E (routed)

  // Expert of pair p (< 0: dropped, an id outside [0, E)).
  __device__ __forceinline__ int expert(int p) const {
    const int t = p / rows_per_token, s = p - t * rows_per_token;
    if (s >= top_k) return num_experts + (s - top_k);
    const int e = ids[int64_t(t) * top_k + s];
    return unsigned(e) < unsigned(num_experts) ? e : -1;
  }
  __device__ __forceinline__ float weight(int p) const {
    const int t = p / rows_per_token, s = p - t * rows_per_token;
    return s >= top_k ? 1.0f : weights[int64_t(t) * top_k + s];
  }
};

}  // namespace fp4moe::cuda
