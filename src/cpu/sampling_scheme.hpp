// The sampling scheme of the device sampler (cuda/sampling/), defined here so that the host can
// run the very same draw: the per-row parameters, the counter-based RNG and the Gumbel-max key.
// Plain integer / IEEE float code, compiled by g++ and nvcc alike (FP4MOE_HD).
//
// One row (a request's logits after the lm_head, F32 [vocab]):
//   1. penalties, as cpu/sampling_cpu.hpp defines them (repetition over prompt ∪ output,
//      presence / frequency over the output so far), from the request's token list;
//   2. temperature == 0: greedy, the highest logit, ties to the lower id. Done.
//   3. x = logit / temperature (IEEE division);
//   4. truncation: keep the shortest prefix of the rank order (x descending, ties: lower id
//      first) allowed by top_k, top_p (mass of the top-k prefix, renormalised) and min_p
//      (x >= max + log(min_p), every tie kept) — as cpu/sampling_cpu.hpp; the masses are
//      sums of fixed-point weights (kMassOne · exp(x - max), truncated to an integer), so they
//      do not depend on the summation order (the same alone or batched, eager or replayed);
//   5. the draw is Gumbel-max over the kept tokens: token = argmax_i x_i − log(−log(u_i)),
//      ties to the lower id, with u_i = uniform(seed, step, i) from Philox4x32-10. It samples
//      exactly softmax(x) restricted to the kept set, needs no sort and no prefix sum, and is
//      fixed by (seed, step): a request draws the same token alone or batched, on any
//      thread count, eager or from a CUDA graph.
// Host and device differ only where expf / logf differ in the last ulp: a Gumbel key within
// ~1e-6 of the runner-up, or a top-p / min-p boundary within ~1e-6 (tests treat these as
// near ties and say so).
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fp4moe::cpu {

inline constexpr int kMaxTopLogprobs = 20;   // logprobs_top_n <= 20 (cpu/sampling_cpu.hpp)
inline constexpr int32_t kNoToken = -1;      // the sentinel of a row that produced nothing

// One request's sampling parameters: a device array of these, one per row (40 bytes, no
// pointers: the runner uploads it once per batch change, it can live inside a graph's inputs).
struct SamplingRowParams {
  float temperature = 0.0f;         // 0: greedy
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;                // >= 0; 0: off
  int32_t logprobs_top_n = -1;      // -1: none; 0: the chosen token's; n <= 20: and the top n
  uint64_t seed = 0;
};
static_assert(sizeof(SamplingRowParams) == 40);

// ---- Philox4x32-10 (Salmon et al., SC'11): counter (4 x 32 bits) + key (2 x 32) -> 4 x 32 ----
struct Philox4 {
  uint32_t v[4];
};

FP4MOE_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

FP4MOE_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The 32 random bits of token i at draw `step` of the request with `seed`: word i % 4 of
// Philox(counter = (i / 4, step lo, step hi, 0x53414D50 'SAMP'), key = seed).
FP4MOE_HD uint32_t sample_bits(uint64_t seed, uint64_t step, uint32_t i) {
  const Philox4 r = philox4x32_10(i >> 2, uint32_t(step), uint32_t(step >> 32), 0x53414D50u, uint32_t(seed),
                                  uint32_t(seed >> 32));
  return r.v[i & 3];
}

// (2j + 1) / 2^24 for the top 23 bits j: exactly representable, never 0 or 1.
FP4MOE_HD float bits_to_open_uniform(uint32_t bits) {
  return float(((bits >> 9) << 1) | 1u) * (1.0f / 16777216.0f);
}

// Fixed-point probability weights: w = floor(kMassOne · exp(x − max)) in [0, 2^40]; a vocabulary
// of up to 2^23 tokens sums without overflow in 64 bits.
inline constexpr double kMassOne = 1099511627776.0;  // 2^40

// Larger float -> larger key (−0 < +0); NaN -> 0, below every number.
FP4MOE_HD uint32_t float_order_key(float f) {
  if (f != f) return 0u;
  uint32_t b;
  __builtin_memcpy(&b, &f, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float of a (non-NaN) order key.
FP4MOE_HD float float_from_order_key(uint32_t key) {
  const uint32_t b = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}

}  // namespace fp4moe::cpu
